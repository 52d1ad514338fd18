"""The trainer's reports to the control plane, as typed messages (docs/trainer-protocol.md).

The trainer validates each report before queueing it (`train/reporter.py`);
the control plane parses the request body into the same type before acting on
it (`api/routes/internal.py`), so both sides agree on every field. Unknown
fields are ignored rather than refused: a trainer of a newer release may send
more than this control plane reads, and must not be stuck retrying a 400.

Every report but the heartbeat carries `seq`, unique and increasing within
the attempt, so a report delivered twice is applied once; every request
carries `attempt`, so reports of an attempt that is no longer current are
rejected (409 `stale_attempt`).
"""

from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field


class _Report(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class _Sequenced(_Report):
    seq: int = Field(ge=1, description="Unique and increasing within the attempt.")


class Heartbeat(_Report):
    attempt: int = Field(description="The attempt this trainer runs.")
    step: int = Field(0, ge=0, description="Optimizer steps done.")
    total_steps: int | None = Field(None, ge=0, description="Optimizer steps the attempt will run in all.")
    start_step: int | None = Field(None, ge=0, description="The step this attempt resumed from.")


class Event(_Sequenced):
    type: Literal["message", "metrics"] = "message"
    level: Literal["info", "warn", "error"] = "info"
    message: str = ""
    data: dict[str, Any] = Field(default_factory=dict)
    created_at: float | None = Field(None, description="Unix time the trainer saw it happen.")


class Events(_Report):
    attempt: int
    events: list[Event] = Field(default_factory=list, max_length=1000)


class CheckpointWritten(_Sequenced):
    attempt: int
    step: int = Field(ge=0)
    prefix: str = Field(description="Object-store prefix of the checkpoint (its manifest written last).")
    metrics: dict[str, Union[float, None]] = Field(default_factory=dict)
    epoch: int | None = Field(None, ge=1, description="The epoch this checkpoint ends (1-based); none mid-epoch.")


class Resumed(_Sequenced):
    attempt: int
    step: int = Field(ge=0, description="The step of the checkpoint the attempt resumed from.")
    prefix: str = ""
    total_steps: int | None = Field(None, ge=0)


class Evaluating(_Sequenced):
    attempt: int
    step: int | None = Field(None, ge=0, description="The last training step.")


class Result(_Sequenced):
    attempt: int
    trained_tokens: int = Field(0, ge=0)
    adapter_prefix: str = Field(description="Object-store prefix of the adapter (or full model) artifact.")
    results_key: str | None = Field(None, description="Object-store key of results.csv.")
    metrics: dict[str, Any] = Field(default_factory=dict)
    eval: dict[str, Any] | None = Field(None, description="Base and fine-tuned eval results, when evaluated.")
    artifact_kind: Literal["adapter", "model"] = "adapter"


FailureClass = Literal["user", "platform", "out_of_memory"]


class Failure(_Sequenced):
    """How an attempt failed. `classification` decides what follows: `user` (the tenant's
    configuration or data) fails the job at once, unbilled retries would fail again;
    `platform` and `out_of_memory` are recorded, and the trainer's exit code then lets the
    scheduler retry (`scheduler/loop.py`). The message is meant for the tenant: no paths,
    no traceback (the trainer logs those under `correlation_id`), and the control plane
    scrubs it again (`domain/tenant_text.py`)."""

    attempt: int
    code: str = Field("training_failed", max_length=100)
    message: str = ""
    param: str | None = None
    # a trainer of an older release sends failures only for the tenant's mistakes
    classification: FailureClass = "user"
    correlation_id: str | None = Field(None, pattern=r"^err_[0-9a-f]{8,64}$",
                                       description="Where the trainer's log has the details.")


Report = Union[Heartbeat, Events, CheckpointWritten, Resumed, Evaluating, Result, Failure]

# kind (the URL's last segment) -> its message type
REPORT_TYPES: dict[str, type[_Report]] = {
    "heartbeat": Heartbeat,
    "events": Events,
    "checkpoints": CheckpointWritten,
    "resumed": Resumed,
    "evaluating": Evaluating,
    "result": Result,
    "failure": Failure,
}
