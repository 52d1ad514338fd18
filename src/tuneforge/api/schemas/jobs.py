"""Fine-tuning jobs, their events, checkpoints, estimates and attempts (/v1/fine_tuning/jobs).

The job, event and checkpoint objects are OpenAI's; the job's extensions follow its OpenAI fields:
precise_status, parent, training_type, attempt, checkpointing, divergence, base_model_sha256,
estimate, data, eval, eval_results, config_hash (docs/api.md)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from tuneforge.api.schemas.base import ApiObject, Number, Page

Auto = Literal["auto"]


class JobError(ApiObject):
    """Why a failed job failed."""

    code: str | None = None
    message: str | None = None
    param: str | None = None


class JobHyperparameters(ApiObject):
    """The values chosen once validation ran; before that, what was asked ("auto" when nothing was)."""

    batch_size: Auto | Number | None = None
    learning_rate_multiplier: Auto | Number | None = None
    n_epochs: Auto | Number | None = None


class FineTuningJob(ApiObject):
    """OpenAI's `fine_tuning.job`, then tuneforge's extensions."""

    id: str
    object: Literal["fine_tuning.job"]
    created_at: int
    error: JobError | None
    fine_tuned_model: str | None
    finished_at: int | None
    hyperparameters: JobHyperparameters
    model: str = Field(description="As asked: a base model, or the fine-tuned model the job continues.")
    organization_id: str
    result_files: list[str]
    seed: int | None
    status: str = Field(description="validating_files, queued, running, pausing, paused, succeeded, failed or "
                                    "cancelled (evaluating too unless TUNEFORGE_OPENAI_STRICT_STATUS); "
                                    "`precise_status` has the platform's own.")
    trained_tokens: int | None
    training_file: str
    validation_file: str | None
    estimated_finish: int | None = None
    integrations: list[dict[str, Any]] | None = None
    metadata: dict[str, Any] | None = None
    method: dict[str, Any] | None = Field(default=None, description="{type, <type>: {hyperparameters}}.")
    user_provided_suffix: str | None = None


class FineTuningJobList(Page):
    data: list[FineTuningJob]


class FineTuningJobEvent(ApiObject):
    id: str
    object: Literal["fine_tuning.job.event"]
    created_at: int
    level: str = Field(description="info, warn or error.")
    message: str
    data: dict[str, Any] | None = None
    type: str | None = Field(default=None, description="message or metrics.")


class FineTuningJobEventList(Page):
    """Newest first. With `stream=true`: each event as a Server-Sent Event, oldest first."""

    data: list[FineTuningJobEvent]


class FineTuningJobCheckpoint(ApiObject):
    """OpenAI's checkpoint; extension: `epoch`, the epoch it ends (null mid-epoch)."""

    id: str
    object: Literal["fine_tuning.job.checkpoint"]
    created_at: int
    fine_tuned_model_checkpoint: str
    fine_tuning_job_id: str
    metrics: dict[str, Any]
    step_number: int


class FineTuningJobCheckpointList(Page):
    data: list[FineTuningJobCheckpoint]


class JobEstimate(ApiObject):
    """Extension: tokens, steps, GPU-hours, price and queue position for a job body."""

    object: Literal["fine_tuning.job.estimate"]
    model: str


class PriceEstimate(JobEstimate):
    """The estimate with Together's field names added: estimated_total_price, allowed_to_proceed,
    user_limit (GPU-hours left this month; null without a hard cap), estimated_train_token_count."""


class JobExport(ApiObject):
    """Extension: the create body that re-runs the job exactly (every chosen value explicit, and a
    `lock` with the base model's and the data's SHA-256)."""

    model: str
    training_file: str


class JobValidation(ApiObject):
    """Extension: the data report of the job's validation against its base model."""

    object: Literal["fine_tuning.job.validation"]
    job_id: str


class JobAttempt(ApiObject):
    object: Literal["fine_tuning.job.attempt"]
    number: int
    status: str
    exit_code: int | None
    failure_class: str | None = Field(description="Platform failures are retried and not billed; user errors "
                                                  "are not retried.")
    gpus: int | None
    started_at: Number | None
    ended_at: Number | None
    pool: str | None
    price_per_gpu_hour: Number | None
    cost: Number


class JobCost(ApiObject):
    so_far: Number
    on_demand: Number
    saving: Number


class JobAttemptList(ApiObject):
    """Extension: every attempt of a job, and what the job cost so far against on-demand prices."""

    object: Literal["list"]
    has_more: bool
    data: list[JobAttempt]
    cost: JobCost
