"""The trainer's side of each training method: its objective (`train/objective.py`).

The method catalogue (`tuneforge.methods`, torch-free) names each method's
objective by a dotted path, "module:function"; only the trainer resolves it,
here. The function takes the method's options, typed: the job spec's stored
dump re-validated into the method's options model.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from tuneforge.methods import TrainingMethod
from tuneforge.train.objective import Objective


def build(method: TrainingMethod, stored_options: Mapping[str, Any]) -> Objective:
    """The objective of `method` for a job whose spec stores `stored_options`."""
    module_name, _, function = method.objective.partition(":")
    builder = getattr(importlib.import_module(module_name), function)
    objective: Objective = builder(method.stored_options(stored_options))
    return objective
