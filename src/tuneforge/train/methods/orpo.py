"""Odds-ratio preference optimisation (`orpo`) on (prompt, chosen, rejected) pairs.

Data: as DPO's (`methods/dpo.py`). No reference model. With `m` the mean
per-token log-probability of an answer and odds(m) = m - log(1 - exp(m)),
the loss of a pair is -m_chosen + beta * -log sigmoid(odds(m_chosen) -
odds(m_rejected)): supervised learning of the chosen answer plus a push away
from the rejected one. The accuracy is the share of pairs whose chosen answer
has the larger mean log-probability.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Union

from pydantic import Field

from tuneforge.domain.job_config import Auto, SupervisedHyperparameters
from tuneforge.domain.spec import DataFileRef, Hyperparameters
from tuneforge.train.methods import EvalDefaults, TrainingMethod
from tuneforge.train.objective import Scores


class OrpoHyperparameters(SupervisedHyperparameters):
    beta: Union[float, Auto] = Field("auto", description="Weight of the odds-ratio term against the "
                                                         "supervised loss of the chosen answer.")


class OrpoObjective:
    name = "orpo"

    def __init__(self, beta: float) -> None:
        self.beta = beta

    def load(self, store: Any, ref: DataFileRef, tokenizer: Any, hp: Hyperparameters, *, label: str,
             base_model_sha256: str) -> list[Any]:
        from tuneforge.train import pairs

        return pairs.load_pairs(store, ref, tokenizer, hp, label=label)

    def prepare(self, run: Any) -> None:
        return None

    def units(self, examples: list[Any]) -> int:
        return len(examples)

    def chunks(self, examples: list[Any], hp: Hyperparameters) -> list[list[Any]]:
        from tuneforge.train import pairs

        return pairs.example_chunks(examples, hp)

    def forward(self, run: Any, chunk: list[Any]) -> Scores:
        import torch.nn.functional as F

        from tuneforge.train import pairs

        logps = pairs.pair_logps(run.model, chunk, run)
        mean_chosen = logps.sums[0::2] / logps.counts[0::2]
        mean_rejected = logps.sums[1::2] / logps.counts[1::2]
        odds = pairs.log_odds(mean_chosen) - pairs.log_odds(mean_rejected)
        losses = -mean_chosen - self.beta * F.logsigmoid(odds)
        return Scores(losses.sum(), int((odds > 0).sum()), len(chunk), logps.num_tokens, logps.num_slots)


def _objective(options: Mapping[str, Any]) -> OrpoObjective:
    return OrpoObjective(float(options["beta"]))


METHOD = TrainingMethod(
    name="orpo",
    summary="odds-ratio preference optimisation on chosen/rejected pairs (no reference model)",
    hyperparameters=OrpoHyperparameters,
    data_kinds=("preference",),
    learning_rate={"lora": 8e-5, "qlora": 8e-5, "full": 8e-6},
    objective=_objective,
    option_defaults={"beta": 0.1},
    option_ranges={"beta": (1e-4, 100.0)},
    sequences_per_example=2,
    default_eval=EvalDefaults(perplexity=False),
)
