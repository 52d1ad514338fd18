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
from typing import Any

from pydantic import Field

from tuneforge.domain.job_config import Auto, SupervisedHyperparameters
from tuneforge.train.methods import EvalDefaults, TrainingMethod


class SimpoHyperparameters(SupervisedHyperparameters):
    beta: float | Auto = Field("auto", description="Scale of the length-normalised reward.")
    gamma: float | Auto = Field("auto", description="Target reward margin between chosen and rejected.")


def _objective(options: Mapping[str, Any]) -> Any:
    from tuneforge.train.pairs import PairObjective

    beta, gamma = float(options["beta"]), float(options["gamma"])

    def loss(logps: Any, reference: Any) -> tuple[Any, Any]:
        import torch.nn.functional as F

        rewards = beta * logps.sums / logps.counts
        margin = rewards[0::2] - rewards[1::2]
        return -F.logsigmoid(margin - gamma), margin > 0

    return PairObjective("simpo", loss, reference=False)


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
