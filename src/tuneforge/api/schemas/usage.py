"""The calling tenant's metered GPU time in a month (/v1/usage), an extension."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from tuneforge.api.schemas.base import ApiObject, Number


class JobUsage(ApiObject):
    object: Literal["usage.job"]
    job_id: str
    model: str
    status: str
    gpu_seconds: Number
    billable_gpu_seconds: Number
    refunded_gpu_seconds: Number
    attempts: int
    cost: Number = Field(description="The billed GPU time at each attempt's pool price.")
    on_demand_cost: Number
    saving: Number


class TokenUsage(ApiObject):
    object: Literal["usage.tokens"]
    kind: str = Field(description="judge.served, judge.operator or judge.tenant: who answered the graders' judges; "
                                  "training.train or training.sample: the training API's passes and samples.")
    model: str
    job_id: str | None = Field(description="The job (or training-API model) that spent them; null: graders/run.")
    requests: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    device_seconds: Number | None = Field(
        default=None, description="The share of a shared device's time they took (training API); null: not metered.")
    cost: Number = Field(description="The tokens at their kind's price per million (price_per_million_tokens), plus "
                                     "device_seconds at the price of a GPU hour.")


class UsageReport(ApiObject):
    object: Literal["list"]
    data: list[JobUsage]
    has_more: bool
    totals: dict[str, Any] = Field(description="The month's GPU-hours against the tenant's allowance.")
    storage: dict[str, Any] = Field(description="What the tenant keeps now against its storage quotas.")
    tokens: list[TokenUsage] = Field(description="Tokens metered beside GPU time in the month (model graders' "
                                                 "judges), per kind, model and job.")
