"""Supervised fine-tuning (`supervised`): next-token cross-entropy on the assistant turns.

Data: OpenAI chat lines `{messages, tools?}` (the chat template renders them;
assistant turns are targets unless `weight: 0`, everything else context unless
`train_on_inputs`) or `{prompt, completion}` lines. The loss is the mean over
the target tokens of a step; the accuracy is the share of target tokens
predicted exactly (argmax). Examples are packed into rows of
`max_seq_length` tokens; attention never crosses from one into the next.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tuneforge.domain.job_config import SupervisedHyperparameters
from tuneforge.train.methods import TrainingMethod
from tuneforge.train.objective import TokenObjective, load_token_examples


def _objective(options: Mapping[str, Any]) -> TokenObjective:
    return TokenObjective("supervised", load_token_examples)


METHOD = TrainingMethod(
    name="supervised",
    summary="supervised fine-tuning on chat or prompt/completion examples",
    hyperparameters=SupervisedHyperparameters,
    data_kinds=("chat", "instruction"),
    learning_rate={"lora": 2e-4, "qlora": 2e-4, "full": 2e-5},
    objective=_objective,
)
