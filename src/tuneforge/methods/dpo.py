"""Direct preference optimisation (`dpo`) on (prompt, chosen, rejected) pairs.

Data: OpenAI's DPO lines `{input, preferred_output, non_preferred_output}`
(or `{prompt, chosen, rejected}`). The reference is the base model. Loss and
accuracy: `train/objectives/dpo.py`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from tuneforge.domain.job_config import Auto, SupervisedHyperparameters
from tuneforge.methods import EvalDefaults, TrainingMethod


class DpoHyperparameters(SupervisedHyperparameters):
    beta: float | Auto = Field("auto", description="Strength of the pull towards the reference (base) "
                                                   "model: larger keeps the fine-tune closer to it.")


class DpoOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    beta: float = Field(0.1, ge=1e-4, le=100.0)


METHOD = TrainingMethod(
    name="dpo",
    summary="direct preference optimisation on chosen/rejected pairs",
    hyperparameters=DpoHyperparameters,
    options=DpoOptions,
    data_kinds=("preference",),
    learning_rate={"lora": 5e-5, "qlora": 5e-5, "full": 5e-7},
    objective="tuneforge.train.objectives.dpo:build",
    sequences_per_example=2,
    beta_pulls_to_reference=True,
    default_eval=EvalDefaults(perplexity=False),
)
