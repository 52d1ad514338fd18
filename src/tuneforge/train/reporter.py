"""How a trainer tells the control plane what happens (docs/trainer-protocol.md).

`Reporter` is the seam. `HttpReporter` queues reports in memory and a
background thread delivers them in order, retrying with backoff while the
control plane is away, and sends heartbeats on its own clock so a long step
never lets the lease lapse. `RecordingReporter` keeps reports in a list for
tests.

A report is `(kind, body)`: kind `events` takes one event (use
`message_event` / `metrics_event`), kinds `checkpoints`, `resumed`, `result` and
`failure` take their protocol body. The reporter adds `seq` (unique and
increasing within the attempt) and `attempt`.

A report the control plane refuses for what it holds (a 4xx other than the
fencing 401/409 and the transient 408/429) is final: the reporter logs the
control plane's reason, drops what is queued and sets `refusal`; the attempt
then sends one `report_refused` failure and exits (`train/runner.py`). It is
not retried: the same report would be refused again until the flush timed out
and the job were retried as the platform's fault. A report the types refuse
before it is queued raises `ReportRefused` at once, for the same reason.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from tuneforge.domain import reports
from tuneforge.domain.metrics import metrics_message
from tuneforge.train.errors import ReportRefused

log = logging.getLogger(__name__)

REPORT_KINDS = ("events", "checkpoints", "resumed", "evaluating", "result", "failure")
FENCED_STATUSES = (401, 409)  # the attempt is no longer current, or its token is bad
TRANSIENT_STATUSES = (408, 429)  # the control plane is busy: the report waits and is sent again
REFUSAL_REASON_CHARS = 500  # of the control plane's answer, in the log and the failure report
_MAX_EVENTS_PER_REQUEST = 100
_MAX_BATCH_BYTES = reports.MAX_REPORT_BYTES // 2  # events of one request, well inside the report bound


class Reporter(Protocol):
    def report(self, kind: str, body: dict[str, Any]) -> int:
        """Queue one report; returns the `seq` it was given."""
        ...

    def progress(self, step: int, total_steps: int) -> None:
        """What the next heartbeat says."""
        ...

    def flush(self, timeout_s: float) -> bool:
        """Wait until every queued report is delivered; False on timeout or fencing."""
        ...

    def close(self) -> None: ...

    @property
    def fenced(self) -> bool:
        """The control plane rejected this attempt: stop at once, write nothing more."""
        ...

    @property
    def stop_requested(self) -> bool:
        """The control plane asked this attempt to stop (the job was cancelled)."""
        ...

    @property
    def refusal(self) -> ReportRefused | None:
        """The control plane refused a report: only a `failure` report is sent from then on."""
        ...


def message_event(message: str, *, level: str = "info", data: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"type": "message", "level": level, "message": message, "data": dict(data or {}),
            "created_at": time.time()}


def metrics_event(data: dict[str, Any]) -> dict[str, Any]:
    return {"type": "metrics", "level": "info", "message": metrics_message(data),
            "data": dict(data), "created_at": time.time()}


def json_safe(value: Any) -> Any:
    """`value` with NaN and infinities replaced by None: JSON has no way to spell them."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    return value


def checked(kind: str, body: dict[str, Any], seq: int, attempt: int) -> dict[str, Any]:
    """`body` of a `kind` report with its `seq`, as its typed message (`domain.reports`) has it:
    JSON-safe, its text made safe and cut to its bounds. A report the control plane would refuse
    raises `ReportRefused` here, in the trainer, rather than being sent."""
    if kind not in REPORT_KINDS:
        raise ValueError(f"unknown report kind {kind!r}; expected one of {REPORT_KINDS}")
    safe = json_safe({**body, "seq": seq})
    try:
        if kind == "events":  # one event here; the delivery thread batches them
            message: Any = reports.parse("events", {"attempt": attempt, "events": [safe]}).events[0]
        else:
            message = reports.parse(kind, {**safe, "attempt": attempt})
    except reports.InvalidReport as exc:
        raise ReportRefused(kind, str(exc)) from None
    return message.model_dump(mode="json", exclude_unset=True)


class SilentReporter:
    """The reporter of ranks 1..N-1 of a multi-process attempt: rank 0 speaks for the group."""

    fenced = False
    stop_requested = False
    refusal = None

    def __init__(self) -> None:
        self._seq = 0

    def report(self, kind: str, body: dict[str, Any]) -> int:
        self._seq += 1
        checked(kind, body, self._seq, 0)
        return self._seq

    def progress(self, step: int, total_steps: int) -> None:
        pass

    def flush(self, timeout_s: float) -> bool:
        return True

    def close(self) -> None:
        pass


@dataclass
class RecordingReporter:
    """Keeps every report in `reports`; `stop_at_step` / `fence_at_step` / `refuse_kinds` script
    the control plane (a report of a kind in `refuse_kinds` is refused as a 400 would be)."""

    attempt: int = 1
    stop_at_step: int | None = None
    fence_at_step: int | None = None
    refuse_kinds: tuple[str, ...] = ()
    reports: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    heartbeats: list[tuple[int, int]] = field(default_factory=list)
    _seq: int = 0
    _fenced: bool = False
    _stop_requested: bool = False
    _refusal: ReportRefused | None = None

    def report(self, kind: str, body: dict[str, Any]) -> int:
        self._seq += 1
        safe = checked(kind, body, self._seq, self.attempt)
        if self._refusal is not None and kind != "failure":
            return self._seq
        if kind in self.refuse_kinds:
            self._refusal = ReportRefused(kind, f"invalid {kind} report: scripted refusal", status=400)
            return self._seq
        self.reports.append((kind, {**safe, "attempt": self.attempt}))
        return self._seq

    @property
    def refusal(self) -> ReportRefused | None:
        return self._refusal

    def progress(self, step: int, total_steps: int) -> None:
        self.heartbeats.append((step, total_steps))
        if self.stop_at_step is not None and step >= self.stop_at_step:
            self._stop_requested = True
        if self.fence_at_step is not None and step >= self.fence_at_step:
            self._fenced = True

    def flush(self, timeout_s: float) -> bool:
        return not self._fenced

    def close(self) -> None:
        pass

    @property
    def fenced(self) -> bool:
        return self._fenced

    @property
    def stop_requested(self) -> bool:
        return self._stop_requested

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [body for report_kind, body in self.reports if report_kind == kind]

    def events(self, event_type: str | None = None) -> list[dict[str, Any]]:
        found = self.of_kind("events")
        return [e for e in found if event_type is None or e["type"] == event_type]


class HttpReporter:
    """Delivers reports to `{callback_url}/internal/v1/jobs/{job_id}/{kind}` from a thread."""

    def __init__(
        self,
        callback_url: str,
        job_id: str,
        attempt: int,
        job_token: str,
        *,
        heartbeat_interval_s: float = 5.0,
        request_timeout_s: float = 10.0,
        initial_backoff_s: float = 0.5,
        max_backoff_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._base_url = f"{callback_url.rstrip('/')}/internal/v1/jobs/{job_id}"
        self._attempt = attempt
        self._heartbeat_interval_s = heartbeat_interval_s
        self._initial_backoff_s = initial_backoff_s
        self._max_backoff_s = max_backoff_s
        self._clock = clock
        self._client = httpx.Client(
            timeout=request_timeout_s, headers={"Authorization": f"Bearer {job_token}"}
        )
        self._cond = threading.Condition()
        self._queue: deque[tuple[str, dict[str, Any]]] = deque()
        self._in_flight = 0
        self._seq = 0
        self._step, self._total_steps = 0, 0
        self._fenced = False
        self._stop_requested = False
        self._refusal: ReportRefused | None = None
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="tuneforge-reporter", daemon=True)

    def start(self) -> HttpReporter:
        self._thread.start()
        return self

    # -- the Reporter protocol, called from the training thread ---------------

    def report(self, kind: str, body: dict[str, Any]) -> int:
        with self._cond:
            self._seq += 1
            safe = checked(kind, body, self._seq, self._attempt)
            if not self._fenced and (self._refusal is None or kind == "failure"):
                self._queue.append((kind, safe))
                self._cond.notify_all()
            return self._seq

    def progress(self, step: int, total_steps: int) -> None:
        with self._cond:
            self._step, self._total_steps = step, total_steps

    def flush(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while (self._queue or self._in_flight) and not self._fenced:
                remaining_s = deadline - time.monotonic()
                if remaining_s <= 0 or not self._thread.is_alive():
                    return False
                self._cond.wait(remaining_s)
            return not self._fenced

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=15.0)
        self._client.close()

    @property
    def fenced(self) -> bool:
        return self._fenced

    @property
    def stop_requested(self) -> bool:
        return self._stop_requested

    @property
    def refusal(self) -> ReportRefused | None:
        return self._refusal

    # -- the delivery thread --------------------------------------------------

    def _run(self) -> None:
        next_heartbeat_at = self._clock()  # the first heartbeat goes out at once
        retry_at = self._clock()
        backoff_s = self._initial_backoff_s
        while True:
            with self._cond:
                if self._closing or self._fenced:
                    self._cond.notify_all()
                    return
                now = self._clock()
                heartbeat_due = now >= next_heartbeat_at
                batch = self._take_batch() if now >= retry_at else None
                if not heartbeat_due and batch is None:
                    wake_at = min(next_heartbeat_at, retry_at) if self._queue else next_heartbeat_at
                    self._cond.wait(max(0.0, wake_at - now))
                    continue
            if heartbeat_due:
                self._send_heartbeat()
                next_heartbeat_at = self._clock() + self._heartbeat_interval_s
            if batch is not None:
                delivered = self._deliver(batch[0], batch[1])
                with self._cond:
                    self._finish_batch(batch, delivered)
                if delivered:
                    backoff_s = self._initial_backoff_s
                else:
                    retry_at = self._clock() + backoff_s
                    backoff_s = min(backoff_s * 2, self._max_backoff_s)

    def _take_batch(self) -> tuple[str, dict[str, Any], int] | None:
        """The head of the queue as one request: consecutive events travel together."""
        if not self._queue:
            return None
        kind, body = self._queue[0]
        if kind != "events":
            self._in_flight = 1
            return kind, {**body, "attempt": self._attempt}, 1
        events: list[dict[str, Any]] = []
        size_bytes = 0
        for queued_kind, queued_body in self._queue:
            if queued_kind != "events" or len(events) >= _MAX_EVENTS_PER_REQUEST:
                break
            size_bytes += reports.json_size_bytes(queued_body) + 2
            if events and size_bytes > _MAX_BATCH_BYTES:  # one event alone always fits: its type bounds it
                break
            events.append(queued_body)
        self._in_flight = len(events)
        return "events", {"attempt": self._attempt, "events": events}, len(events)

    def _finish_batch(self, batch: tuple[str, dict[str, Any], int], delivered: bool) -> None:
        if delivered and not self._fenced:
            for _ in range(batch[2]):
                self._queue.popleft()
        self._in_flight = 0
        self._cond.notify_all()

    def _deliver(self, kind: str, body: dict[str, Any]) -> bool:
        response = self._post(kind, body)
        if response is None:
            return False
        if response.status_code in FENCED_STATUSES:
            self._mark_fenced(kind, response)
            return False
        if response.is_success:
            return True
        if 400 <= response.status_code < 500 and response.status_code not in TRANSIENT_STATUSES:
            self._mark_refused(kind, response)
            return False
        log.warning("report %s answered %s; will retry", kind, response.status_code)
        return False

    def _send_heartbeat(self) -> None:
        with self._cond:
            body = {"attempt": self._attempt, "step": self._step, "total_steps": self._total_steps}
        response = self._post("heartbeat", body)
        if response is None:
            return
        if response.status_code in FENCED_STATUSES:
            self._mark_fenced("heartbeat", response)
        elif response.is_success:
            try:
                action = response.json().get("action")
            except ValueError:
                action = None
            if action == "stop":
                self._stop_requested = True

    def _post(self, kind: str, body: dict[str, Any]) -> httpx.Response | None:
        try:
            return self._client.post(f"{self._base_url}/{kind}", json=body)
        except httpx.HTTPError as exc:
            log.warning("report %s not delivered (%s); will retry", kind, exc)
            return None

    def _mark_refused(self, kind: str, response: httpx.Response) -> None:
        """A final answer: log the control plane's reason, keep only a queued failure report (the
        refused report itself and what follows it are dropped)."""
        reason = _error_message(response)
        log.error("the control plane refused the %s report (HTTP %s): %s", kind, response.status_code, reason)
        with self._cond:
            if self._refusal is None:
                self._refusal = ReportRefused(kind, reason, status=response.status_code)
            if self._queue:
                self._queue.popleft()  # the refused report, at the head while it was in flight
            kept = [item for item in self._queue if item[0] == "failure"]
            self._queue.clear()
            self._queue.extend(kept)
            self._cond.notify_all()

    def _mark_fenced(self, kind: str, response: httpx.Response) -> None:
        log.error("control plane fenced this attempt on %s (HTTP %s)", kind, response.status_code)
        with self._cond:
            self._fenced = True
            self._queue.clear()
            self._cond.notify_all()


def _error_message(response: httpx.Response) -> str:
    """The reason in an answer's OpenAI error envelope (its start, for a body that has none)."""
    try:
        error = response.json().get("error") or {}
        message = error.get("message") if isinstance(error, dict) else None
    except (ValueError, AttributeError):
        message = None
    return str(message or response.text or "no reason given")[:REFUSAL_REASON_CHARS]
