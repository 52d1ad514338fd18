"""Supervised fine-tuning (`supervised`): next-token cross-entropy on the assistant turns.

Data: OpenAI chat lines `{messages, tools?}` (the chat template renders them;
assistant turns are targets unless `weight: 0`, everything else context unless
`train_on_inputs`) or `{prompt, completion}` lines. Objective:
`train/objectives/supervised.py`.
"""

from __future__ import annotations

from tuneforge.domain.job_config import SupervisedHyperparameters
from tuneforge.methods import TrainingMethod

METHOD = TrainingMethod(
    name="supervised",
    summary="supervised fine-tuning on chat or prompt/completion examples",
    hyperparameters=SupervisedHyperparameters,
    data_kinds=("chat", "instruction"),
    learning_rate={"lora": 2e-4, "qlora": 2e-4, "full": 2e-5},
    objective="tuneforge.train.objectives.supervised:build",
)
