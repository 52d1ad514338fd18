"""Simple preference optimisation (`simpo`) on (prompt, chosen, rejected) pairs.

Data: as DPO's (`methods/dpo.py`). No reference model: the implied reward of
an answer is its length-normalised log-probability, r = beta * log pi(y|x) /
|y| (|y| its answer tokens), and the loss of a pair is
-log sigmoid(r_chosen - r_rejected - gamma), with gamma a target margin
(Meng et al., 2024). Both answers go through the model in one packed forward
pass. The accuracy is the share of pairs whose chosen answer has the larger
reward.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Union

from pydantic import Field

from tuneforge.domain.job_config import Auto, SupervisedHyperparameters
from tuneforge.domain.spec import DataFileRef, Hyperparameters
from tuneforge.train.methods import EvalDefaults, TrainingMethod
from tuneforge.train.objective import Scores


class SimpoHyperparameters(SupervisedHyperparameters):
    beta: Union[float, Auto] = Field("auto", description="Scale of the length-normalised reward.")
    gamma: Union[float, Auto] = Field("auto", description="Target reward margin between chosen and rejected.")


class SimpoObjective:
    name = "simpo"

    def __init__(self, beta: float, gamma: float) -> None:
        self.beta, self.gamma = beta, gamma

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
        rewards = self.beta * logps.sums / logps.counts
        margin = rewards[0::2] - rewards[1::2]
        losses = -F.logsigmoid(margin - self.gamma)
        return Scores(losses.sum(), int((margin > 0).sum()), len(chunk), logps.num_tokens, logps.num_slots)


def _objective(options: Mapping[str, Any]) -> SimpoObjective:
    return SimpoObjective(float(options["beta"]), float(options["gamma"]))


METHOD = TrainingMethod(
    name="simpo",
    summary="simple preference optimisation on chosen/rejected pairs (length-normalised, no reference model)",
    hyperparameters=SimpoHyperparameters,
    data_kinds=("preference",),
    learning_rate={"lora": 5e-5, "qlora": 5e-5, "full": 5e-7},
    objective=_objective,
    option_defaults={"beta": 2.0, "gamma": 0.5},
    option_ranges={"beta": (1e-4, 100.0), "gamma": (0.0, 100.0)},
    sequences_per_example=2,
    default_eval=EvalDefaults(perplexity=False),
)
