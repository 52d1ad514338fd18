"""Odds-ratio preference optimisation (`orpo`) on (prompt, chosen, rejected) pairs.

Data: as DPO's. No reference model. Loss and accuracy: `train/objectives/orpo.py`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from tuneforge.domain.job_config import Auto, SupervisedHyperparameters
from tuneforge.methods import EvalDefaults, TrainingMethod


class OrpoHyperparameters(SupervisedHyperparameters):
    beta: float | Auto = Field("auto", description="Weight of the odds-ratio term against the "
                                                   "supervised loss of the chosen answer.")


class OrpoOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    beta: float = Field(0.1, ge=1e-4, le=100.0)


METHOD = TrainingMethod(
    name="orpo",
    summary="odds-ratio preference optimisation on chosen/rejected pairs (no reference model)",
    hyperparameters=OrpoHyperparameters,
    options=OrpoOptions,
    data_kinds=("preference",),
    learning_rate={"lora": 8e-5, "qlora": 8e-5, "full": 8e-6},
    objective="tuneforge.train.objectives.orpo:build",
    sequences_per_example=2,
    default_eval=EvalDefaults(perplexity=False),
)
