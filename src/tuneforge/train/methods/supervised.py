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
from tuneforge.domain.spec import DataFileRef, Hyperparameters
from tuneforge.train import objective as tokens
from tuneforge.train.methods import TrainingMethod


class TokenObjective:
    """Cross-entropy on the target tokens of tokenized examples (`data.tokenize`)."""

    name = "supervised"

    def load(self, store: Any, ref: DataFileRef, tokenizer: Any, hp: Hyperparameters, *, label: str,
             base_model_sha256: str) -> list[Any]:
        return tokens.load_token_examples(store, ref, tokenizer, hp, label=label, base_model_sha256=base_model_sha256)

    def prepare(self, run: Any) -> None:
        return None

    def units(self, examples: list[Any]) -> int:
        return tokens.token_units(examples)

    def chunks(self, examples: list[Any], hp: Hyperparameters) -> list[list[Any]]:
        return tokens.token_chunks(examples, hp)

    def forward(self, run: Any, chunk: list[Any]) -> tokens.Scores:
        return tokens.token_scores(run, chunk)


def _objective(options: Mapping[str, Any]) -> TokenObjective:
    return TokenObjective()


METHOD = TrainingMethod(
    name="supervised",
    summary="supervised fine-tuning on chat or prompt/completion examples",
    hyperparameters=SupervisedHyperparameters,
    data_kinds=("chat", "instruction"),
    learning_rate={"lora": 2e-4, "qlora": 2e-4, "full": 2e-5},
    objective=_objective,
)
