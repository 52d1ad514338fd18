"""Simple preference optimisation (`simpo`) on (prompt, chosen, rejected) pairs.

Data: as DPO's. No reference model: the reward is the length-normalised
log-probability. Loss and accuracy: `train/objectives/simpo.py`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from tuneforge.domain.job_config import Auto, SupervisedHyperparameters
from tuneforge.methods import EvalDefaults, TrainingMethod


class SimpoHyperparameters(SupervisedHyperparameters):
    beta: float | Auto = Field("auto", description="Scale of the length-normalised reward.")
    gamma: float | Auto = Field("auto", description="Target reward margin between chosen and rejected.")


class SimpoOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    beta: float = Field(2.0, ge=1e-4, le=100.0)
    gamma: float = Field(0.5, ge=0.0, le=100.0)


METHOD = TrainingMethod(
    name="simpo",
    summary="simple preference optimisation on chosen/rejected pairs (length-normalised, no reference model)",
    hyperparameters=SimpoHyperparameters,
    options=SimpoOptions,
    data_kinds=("preference",),
    learning_rate={"lora": 5e-5, "qlora": 5e-5, "full": 5e-7},
    objective="tuneforge.train.objectives.simpo:build",
    sequences_per_example=2,
    default_eval=EvalDefaults(perplexity=False),
)
