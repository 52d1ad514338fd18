"""Hyperparameter sweeps (/v1/fine_tuning/sweeps), an extension."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from tuneforge.api.schemas.base import ApiObject, Number


class SweepTrial(ApiObject):
    number: int
    job_id: str | None
    params: dict[str, Any]
    status: str
    rungs: Any = Field(description="The objective at each rung the trial reached.")
    objective: Number | None
    fine_tuned_model: str | None
    gpu_seconds: Number


class Sweep(ApiObject):
    id: str
    object: Literal["fine_tuning.sweep"]
    status: str
    created_at: int
    finished_at: int | None
    error: dict[str, Any] | None
    sampler: str
    max_trials: int
    max_parallel: int
    objective: dict[str, Any] | None
    early_stopping: dict[str, Any] | None
    search_space: dict[str, Any]
    seed: int | None
    trials: list[SweepTrial]
    best_trial: SweepTrial | None
    stopped_early: int = Field(description="Trials stopped early (ASHA).")
    gpu_seconds: Number


class SweepList(ApiObject):
    object: Literal["list"]
    has_more: bool
    data: list[Sweep]
