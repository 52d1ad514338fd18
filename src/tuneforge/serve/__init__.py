"""Inference for base and fine-tuned models: adapters hot-swapped on one loaded base.

`engine_for(platform)` gives the platform's `InferenceEngine`, created on the
first request that needs it: torch and transformers are imported then, never
when the API starts.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from tuneforge.services.context import Platform

if TYPE_CHECKING:
    from tuneforge.serve.engine import InferenceEngine

_create_lock = threading.Lock()


def engine_for(platform: Platform) -> InferenceEngine:
    engine = platform.inference
    if engine is None:
        with _create_lock:
            if platform.inference is None:
                from tuneforge.serve.engine import InferenceEngine

                platform.inference = InferenceEngine.from_settings(platform.settings, platform.store)
            engine = platform.inference
    return engine
