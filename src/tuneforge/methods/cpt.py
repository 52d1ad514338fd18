"""Continued pre-training (`cpt`) on raw text: `{"text": ...}` lines, every token a target.

Objective (windows of `max_seq_length`, packed like supervised examples):
`train/objectives/cpt.py`.
"""

from __future__ import annotations

from tuneforge.domain.job_config import SupervisedHyperparameters
from tuneforge.methods import TrainingMethod

METHOD = TrainingMethod(
    name="cpt",
    summary="continued pre-training on raw {text} documents",
    hyperparameters=SupervisedHyperparameters,
    data_kinds=("text",),
    learning_rate={"lora": 1e-4, "qlora": 1e-4, "full": 1e-5},
    objective="tuneforge.train.objectives.cpt:build",
)
