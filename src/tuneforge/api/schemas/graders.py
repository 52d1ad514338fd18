"""`/v1/fine_tuning/alpha/graders/run` and `/validate`, in OpenAI's shapes."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from tuneforge.api.schemas.base import ApiObject, Number

MAX_SAMPLE_CHARS = 1_000_000


class GraderValidateBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    grader: dict[str, Any] = Field(description="A grader object: string_check, text_similarity, score_model, "
                                               "label_model, python or multi.")


class GraderRunBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    grader: dict[str, Any] = Field(description="The grader to run.")
    model_sample: str = Field(max_length=MAX_SAMPLE_CHARS, description="What the model wrote: the `sample` "
                              "namespace (`output_json` when it is JSON).")
    item: Any = Field(None, description="The dataset line: the `item` namespace.")


class GraderErrors(ApiObject):
    formula_parse_error: bool
    invalid_variable_error: bool
    model_grader_parse_error: bool
    model_grader_refusal_error: bool
    model_grader_server_error: bool
    model_grader_server_error_details: str | None
    other_error: bool
    python_grader_runtime_error: bool
    python_grader_runtime_error_details: str | None
    python_grader_server_error: bool
    python_grader_server_error_type: str | None
    sample_parse_error: bool
    truncated_observation_error: bool
    unresponsive_reward_error: bool


class GraderRunMetadata(ApiObject):
    name: str
    type: str
    errors: GraderErrors
    execution_time: Number
    scores: dict[str, Number]
    token_usage: int | None
    sampled_model_name: str | None


class GraderRunResult(ApiObject):
    reward: Number
    sub_rewards: dict[str, Number]
    metadata: GraderRunMetadata
    model_grader_token_usage_per_model: dict[str, int]


class GraderValidateResult(ApiObject):
    grader: dict[str, Any]
