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

log = logging.getLogger(__name__)

REPORT_KINDS = ("events", "checkpoints", "resumed", "evaluating", "result", "failure")
FENCED_STATUSES = (401, 409)  # the attempt is no longer current, or its token is bad
_MAX_EVENTS_PER_REQUEST = 100


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
    """`body` of a `kind` report with its `seq`, JSON-safe, once it is a valid typed message
    (`domain.reports`): a report the control plane would refuse fails here, in the trainer."""
    if kind not in REPORT_KINDS:
        raise ValueError(f"unknown report kind {kind!r}; expected one of {REPORT_KINDS}")
    safe = json_safe({**body, "seq": seq})
    if kind == "events":
        reports.Event.model_validate(safe)
    else:
        reports.REPORT_TYPES[kind].model_validate({**safe, "attempt": attempt})
    return safe


class SilentReporter:
    """The reporter of ranks 1..N-1 of a multi-process attempt: rank 0 speaks for the group."""

    fenced = False
    stop_requested = False

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
    """Keeps every report in `reports`; `stop_at_step` / `fence_at_step` script the control plane."""

    attempt: int = 1
    stop_at_step: int | None = None
    fence_at_step: int | None = None
    reports: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    heartbeats: list[tuple[int, int]] = field(default_factory=list)
    _seq: int = 0
    _fenced: bool = False
    _stop_requested: bool = False

    def report(self, kind: str, body: dict[str, Any]) -> int:
        self._seq += 1
        self.reports.append((kind, {**checked(kind, body, self._seq, self.attempt), "attempt": self.attempt}))
        return self._seq

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
            if not self._fenced:
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
        events = []
        for queued_kind, queued_body in self._queue:
            if queued_kind != "events" or len(events) >= _MAX_EVENTS_PER_REQUEST:
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

    def _mark_fenced(self, kind: str, response: httpx.Response) -> None:
        log.error("control plane fenced this attempt on %s (HTTP %s)", kind, response.status_code)
        with self._cond:
            self._fenced = True
            self._queue.clear()
            self._cond.notify_all()
