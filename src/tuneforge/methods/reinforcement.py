"""Reinforcement fine-tuning (`reinforcement`): GRPO on samples the current model writes, scored by a grader.

OpenAI's shape: `method: {"type": "reinforcement", "reinforcement": {"grader":
{...}, "hyperparameters": {...}, "response_format": {...}}}`. Data: prompt
lines (`{messages: [... the user's turn last], <fields the grader reads>}`,
the `prompt` shape of `data/shapes.py`). Each step samples a group of
completions per prompt from the current policy, grades them
(`graders/score.py`, python graders in the sandbox) and optimises the clipped
policy-gradient objective on group-normalised advantages
(`train/objectives/reinforcement.py`). docs/rft.md says what every
hyperparameter does here.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tuneforge.domain.job_config import Auto, SupervisedHyperparameters
from tuneforge.methods import EvalDefaults, TrainingMethod

ReasoningEffort = Literal["default", "low", "medium", "high"]
LossAggregation = Literal["token_mean", "sequence_mean", "constant"]
# what reasoning_effort does to the longest completion sampled
EFFORT_TOKEN_SCALE = {"default": 1.0, "low": 0.5, "medium": 1.0, "high": 2.0}
MAX_GROUP = 64


class ReinforcementHyperparameters(SupervisedHyperparameters):
    compute_multiplier: float | Auto = Field("auto", description="Scales the completions sampled per prompt "
                                                                 "(samples_per_prompt x this, 2-64).")
    eval_interval: int | Auto = Field("auto", description="Training steps between validation rewards "
                                                          "(auto: a tenth of the steps).")
    eval_samples: int | Auto = Field("auto", description="Validation prompts sampled and graded at each "
                                                         "validation (auto: all, at most 64).")
    reasoning_effort: ReasoningEffort | Auto = Field("auto", description="Scales the longest completion: low "
                                                     "x0.5, default/medium x1, high x2 max_completion_tokens.")
    samples_per_prompt: int | Auto = Field("auto", description="Completions sampled per prompt: the group "
                                                               "whose rewards are normalised together (8).")
    temperature: float | Auto = Field("auto", description="Sampling temperature of the rollouts (1.0).")
    max_completion_tokens: int | Auto = Field("auto", description="Longest completion sampled, in tokens (128).")
    kl_coef: float | Auto = Field("auto", description="Weight of the KL penalty towards the base model "
                                                      "(its adapter off; LoRA only); 0 turns it off (0.0).")
    clip_epsilon: float | Auto = Field("auto", description="Clipping of the importance ratio, 1 +- this (0.2).")
    loss_aggregation: LossAggregation | Auto = Field(
        "auto", description="token_mean: every completion token of the step weighs the same (default); "
                            "sequence_mean: every completion weighs the same; constant: the token losses "
                            "summed and divided by completions x max_completion_tokens (Dr. GRPO).")
    scale_rewards: bool | Auto = Field("auto", description="Divide each group's advantages by its reward "
                                                           "standard deviation (true).")
    max_grader_error_rate: float | Auto = Field(
        "auto", description="Share of a step's samples the grader may fail on (0.5); two steps past it in a "
                            "row fail the job (the grader's fault).")
    grader: dict[str, Any] | None = Field(None, description="Set from the method block's grader.")
    response_format: dict[str, Any] | None = Field(None, description="Set from the method block's response_format.")


class ReinforcementOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    grader: dict[str, Any]
    response_format: dict[str, Any] | None = None
    compute_multiplier: float = Field(1.0, ge=0.25, le=8.0)
    eval_interval: int = Field(0, ge=0, le=100_000)  # 0: a tenth of the steps
    eval_samples: int = Field(0, ge=0, le=4096)  # 0: the validation set, at most 64 prompts
    reasoning_effort: ReasoningEffort = "default"
    samples_per_prompt: int = Field(8, ge=2, le=MAX_GROUP)
    temperature: float = Field(1.0, ge=0.05, le=2.0)
    max_completion_tokens: int = Field(128, ge=1, le=8192)
    kl_coef: float = Field(0.0, ge=0.0, le=10.0)
    clip_epsilon: float = Field(0.2, ge=0.0, le=10.0)
    loss_aggregation: LossAggregation = "token_mean"
    scale_rewards: bool = True
    max_grader_error_rate: float = Field(0.5, ge=0.0, le=1.0)

    @property
    def group_size(self) -> int:
        return max(2, min(MAX_GROUP, round(self.samples_per_prompt * self.compute_multiplier)))

    @property
    def completion_tokens(self) -> int:
        return max(1, round(self.max_completion_tokens * EFFORT_TOKEN_SCALE[self.reasoning_effort]))


METHOD = TrainingMethod(
    name="reinforcement",
    summary="reinforcement fine-tuning: GRPO on sampled completions scored by a grader",
    hyperparameters=ReinforcementHyperparameters,
    options=ReinforcementOptions,
    data_kinds=("prompt",),
    learning_rate={"lora": 1e-5, "qlora": 1e-5, "full": 1e-6},
    objective="tuneforge.train.objectives.reinforcement:build",
    sequences_per_example=8,
    beta_pulls_to_reference=False,
    default_eval=EvalDefaults(perplexity=False),
    block_fields=("grader", "response_format"),
    generates=True,
)
