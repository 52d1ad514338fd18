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

Reports are bounded and their text is data (`domain/tenant_text.py`): eval
samples are a model's own output and a byte-level tokenizer can emit any byte.
So the types make text safe rather than refuse it — free text (messages, the
strings inside `data`, `metrics` and `eval`) is sanitised (`safe_text`) and
cut with a marker past its bound — and refuse only what no trainer of this
release sends: a report over `MAX_REPORT_BYTES`, free-form data over its byte
bound or nested deeper than `MAX_DATA_DEPTH`, an identifier (a storage key, a
code) that is too long or holds a control character. `parse` is the one way
in, on both sides: a report it refuses ends the attempt once (class
`report_refused`, `train/runner.py`), never a retry loop.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from tuneforge.domain.tenant_text import bounded, safe_data, safe_text

# one report as JSON (ASCII-escaped, an upper bound of its UTF-8 size): far above a batch of
# 100 bounded events or a result with its eval samples, far below the edge's body limit
MAX_REPORT_BYTES = 4 * 1024 * 1024
MAX_TEXT_CHARS = 4000  # a message; longer is cut with a marker
MAX_DATA_STRING_CHARS = 4000  # each string inside `data`, `metrics`, `eval`; longer is cut with a marker
MAX_IDENTIFIER_CHARS = 1024  # a storage key or prefix the trainer built; longer is refused
MAX_DATA_DEPTH = 12  # nesting of `data` / `eval`; the trainer's deepest is 4
MAX_EVENT_DATA_BYTES = 16 * 1024  # one event's `data` as JSON
MAX_METRICS_BYTES = 64 * 1024  # a result's `metrics` as JSON
MAX_EVAL_BYTES = 1024 * 1024  # a result's `eval` (figures, samples, errors) as JSON
MAX_EVENTS_PER_REPORT = 1000


def json_size_bytes(value: Any) -> int:
    """Size of `value` as ASCII-escaped JSON: what the bounds above count."""
    return len(json.dumps(value, default=str))


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(item) for item in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(item) for item in value), default=0)
    return 0


def _free_form(limit_bytes: int) -> AfterValidator:
    """Free-form JSON data with its strings made safe and cut, refused past `limit_bytes` or
    `MAX_DATA_DEPTH`."""
    def check(value: Any) -> Any:
        if _depth(value) > MAX_DATA_DEPTH:
            raise ValueError(f"nested deeper than {MAX_DATA_DEPTH} levels")
        value = safe_data(value, max_string_chars=MAX_DATA_STRING_CHARS)
        size_bytes = json_size_bytes(value)
        if size_bytes > limit_bytes:
            raise ValueError(f"is {size_bytes} bytes as JSON, over the limit of {limit_bytes}")
        return value
    return AfterValidator(check)


def _identifier(value: str) -> str:
    if safe_text(value) != value:
        raise ValueError("must not contain control characters or lone surrogates")
    return value


# text shown to people: made safe and cut, never refused
Text = Annotated[str, AfterValidator(lambda value: bounded(safe_text(value), MAX_TEXT_CHARS))]
# names the trainer built (storage keys, codes): refused when malformed, since changing them would break them
Identifier = Annotated[str, Field(max_length=MAX_IDENTIFIER_CHARS), AfterValidator(_identifier)]


class InvalidReport(ValueError):
    """A report its type refuses; `param` names the field (dotted path), the message says why."""

    def __init__(self, kind: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.param = param


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
    message: Text = ""
    data: Annotated[dict[str, Any], _free_form(MAX_EVENT_DATA_BYTES)] = Field(default_factory=dict)
    created_at: float | None = Field(None, description="Unix time the trainer saw it happen.")


class Events(_Report):
    attempt: int
    events: list[Event] = Field(default_factory=list, max_length=MAX_EVENTS_PER_REPORT)


class CheckpointWritten(_Sequenced):
    attempt: int
    step: int = Field(ge=0)
    prefix: Identifier = Field(description="Object-store prefix of the checkpoint (its manifest written last).")
    metrics: dict[Identifier, float | None] = Field(default_factory=dict, max_length=200)
    epoch: int | None = Field(None, ge=1, description="The epoch this checkpoint ends (1-based); none mid-epoch.")


class Resumed(_Sequenced):
    attempt: int
    step: int = Field(ge=0, description="The step of the checkpoint the attempt resumed from.")
    prefix: Identifier = ""
    total_steps: int | None = Field(None, ge=0)


class Evaluating(_Sequenced):
    attempt: int
    step: int | None = Field(None, ge=0, description="The last training step.")


class Result(_Sequenced):
    attempt: int
    trained_tokens: int = Field(0, ge=0)
    adapter_prefix: Identifier = Field(description="Object-store prefix of the adapter (or full model) artifact.")
    results_key: Identifier | None = Field(None, description="Object-store key of results.csv.")
    metrics: Annotated[dict[str, Any], _free_form(MAX_METRICS_BYTES)] = Field(default_factory=dict)
    eval: Annotated[dict[str, Any], _free_form(MAX_EVAL_BYTES)] | None = Field(
        None, description="Base and fine-tuned eval results, when evaluated; samples are the models' own text.")
    artifact_kind: Literal["adapter", "model"] = "adapter"


FailureClass = Literal["user", "platform", "out_of_memory", "report_refused"]
# classes that fail the job at once: retrying would fail the same way (`services/reports.fail`)
FINAL_FAILURE_CLASSES = frozenset({"user", "report_refused"})


class Failure(_Sequenced):
    """How an attempt failed. `classification` decides what follows: `user` (the tenant's
    configuration or data) fails the job at once, unbilled retries would fail again;
    `platform` and `out_of_memory` are recorded, and the trainer's exit code then lets the
    scheduler retry (`scheduler/loop.py`); `report_refused` (a report of this attempt was refused
    by its type, here or in the control plane) fails the job at once as well: the same report
    would be refused again. The message is meant for the tenant: no paths,
    no traceback (the trainer logs those under `correlation_id`), and the control plane
    scrubs it again (`domain/tenant_text.py`)."""

    attempt: int
    code: Annotated[str, Field(max_length=100), AfterValidator(_identifier)] = "training_failed"
    message: Text = ""
    param: Text | None = None
    # a trainer of an older release sends failures only for the tenant's mistakes
    classification: FailureClass = "user"
    correlation_id: str | None = Field(None, pattern=r"^err_[0-9a-f]{8,64}$",
                                       description="Where the trainer's log has the details.")


Report = Heartbeat | Events | CheckpointWritten | Resumed | Evaluating | Result | Failure

# kind (the URL's last segment) -> its message type
REPORT_TYPES: dict[str, type[Report]] = {
    "heartbeat": Heartbeat,
    "events": Events,
    "checkpoints": CheckpointWritten,
    "resumed": Resumed,
    "evaluating": Evaluating,
    "result": Result,
    "failure": Failure,
}


def parse(kind: str, body: Any) -> Report:
    """The typed message of a `kind` report, its text made safe; `InvalidReport` naming the field
    it lacks or gets wrong, or saying it is over `MAX_REPORT_BYTES`. Both sides parse with this."""
    if kind not in REPORT_TYPES:
        raise InvalidReport(kind, f"unknown report kind {kind!r}", param="kind")
    size_bytes = json_size_bytes(body)
    if size_bytes > MAX_REPORT_BYTES:
        raise InvalidReport(kind, f"the {kind} report is {size_bytes} bytes as JSON, over the limit of "
                                  f"{MAX_REPORT_BYTES}", param=None)
    try:
        return REPORT_TYPES[kind].model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or None
        reason = first["msg"].removeprefix("Value error, ")
        raise InvalidReport(kind, f"invalid {kind} report: {where or 'body'}: {reason}", param=where) from None
