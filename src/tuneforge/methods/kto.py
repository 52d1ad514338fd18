"""Kahneman-Tversky optimisation (`kto`) on unpaired completions labelled desirable or not.

Data: `{input, output, label}` or `{prompt, completion, label}` lines (the
`kto` shape, `data/shapes.py`). The reference is the base model. Loss,
reference point and accuracy: `train/objectives/kto.py`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from tuneforge.domain.job_config import Auto, SupervisedHyperparameters
from tuneforge.methods import EvalDefaults, TrainingMethod


class KtoHyperparameters(SupervisedHyperparameters):
    beta: float | Auto = Field("auto", description="Sharpness of the value function around the "
                                                   "reference point; larger keeps the fine-tune closer "
                                                   "to the base model.")
    desirable_weight: float | Auto = Field("auto", description="Weight of the desirable completions' "
                                                               "loss (lambda_D).")
    undesirable_weight: float | Auto = Field("auto", description="Weight of the undesirable completions' "
                                                                 "loss (lambda_U).")


class KtoOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    beta: float = Field(0.1, ge=1e-4, le=100.0)
    desirable_weight: float = Field(1.0, ge=0.0, le=100.0)
    undesirable_weight: float = Field(1.0, ge=0.0, le=100.0)


METHOD = TrainingMethod(
    name="kto",
    summary="Kahneman-Tversky optimisation on completions labelled desirable or undesirable",
    hyperparameters=KtoHyperparameters,
    options=KtoOptions,
    data_kinds=("kto",),
    learning_rate={"lora": 5e-5, "qlora": 5e-5, "full": 5e-7},
    objective="tuneforge.train.objectives.kto:build",
    sequences_per_example=2,
    beta_pulls_to_reference=True,
    default_eval=EvalDefaults(perplexity=False),
)
