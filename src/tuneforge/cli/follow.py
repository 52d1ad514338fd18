"""`tuneforge jobs follow`: a job's events as they happen and its loss, to the end.

On a terminal the loss is one live line on stderr; when the output is a file or a pipe (a CI log),
each metrics update is one plain line instead, so the log keeps every loss. The ETA is measured,
never guessed: none until the stream has timed at least two steps, then the steps left times the
seconds per step seen so far.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any, NamedTuple

import typer
from rich.console import Console

from tuneforge.cli import output
from tuneforge.cli.api import EXIT_REFUSED, Api, CliFailure, sse_data
from tuneforge.cli.output import err, out

# steps the stream must have timed before an ETA is shown
TIMED_STEPS_FOR_ETA = 2


class _Seen(NamedTuple):
    step: int
    arrived_s: float  # time.monotonic() when the event arrived
    created_s: float | None  # the event's own `created_at` (whole seconds, the server's clock)


class StepTimer:
    """Seconds per optimizer step, from the metrics events of one run of steps."""

    def __init__(self) -> None:
        self._first: _Seen | None = None
        self._last: _Seen | None = None

    def observe(self, step: int, arrived_s: float, created_s: float | None = None) -> None:
        seen = _Seen(step, arrived_s, created_s)
        if self._first is None or (self._last is not None and step < self._last.step):
            self._first = seen  # the first step, or a new attempt resumed from an earlier checkpoint
        self._last = seen

    def seconds_per_step(self) -> float | None:
        first, last = self._first, self._last
        if first is None or last is None or last.step - first.step < TIMED_STEPS_FOR_ETA:
            return None
        steps = last.step - first.step
        per_step = (last.arrived_s - first.arrived_s) / steps
        if first.created_s is not None and last.created_s is not None:
            stamped = (last.created_s - first.created_s) / steps
            # the events of steps taken before the stream was opened arrive all at once: then their
            # own times say how long the steps took
            if stamped * steps >= 2 and per_step < stamped / 2:
                per_step = stamped
        return per_step if per_step > 0 else None

    def eta_s(self, step: Any, total: Any) -> float | None:
        per_step = self.seconds_per_step()
        if per_step is None or not isinstance(step, int) or not isinstance(total, int) or not 0 <= step < total:
            return None
        return per_step * (total - step)


def loss_line(data: dict[str, Any], eta_s: float | None = None) -> str:
    """`step 12/40  loss 1.2345  val 1.3456  lr 1.0e-04  1234 tok/s  ETA 1m05s` from a metrics event."""
    parts = [f"step {data.get('step', '?')}/{data.get('total_steps', '?')}"]
    for key, label, shown in (("train_loss", "loss", "{:.4f}"), ("valid_loss", "val", "{:.4f}"),
                              ("learning_rate", "lr", "{:.1e}"), ("tokens_per_second", "", "{:.0f} tok/s")):
        value = data.get(key)
        if isinstance(value, (int, float)) and math.isfinite(value):
            parts.append(f"{label} {shown.format(value)}".strip())
    if eta_s is not None:
        parts.append(f"ETA {int(eta_s // 60)}m{int(eta_s % 60):02d}s")
    return "  ".join(parts)


def follow_job(api: Api, job_id: str, *, quiet: bool, as_json: bool = False) -> None:
    """Follow the job to its end. `quiet`: stdout already holds the created job's JSON, so nothing
    but the loss (on stderr) is shown; `as_json`: each event as one JSON line on stdout."""
    from rich.live import Live

    timer = StepTimer()
    loss_to: Console = err if quiet else out
    live_line = loss_to.is_terminal
    with api.stream("GET", f"/fine_tuning/jobs/{job_id}/events", params={"stream": "true"}) as response, \
            Live("", console=err, transient=True, auto_refresh=False) as live:
        for event in sse_data(response):
            if as_json:
                typer.echo(json.dumps(event))
            elif event.get("type") == "metrics":
                data = event.get("data") or {}
                if isinstance(data.get("step"), int):
                    created = event.get("created_at")
                    timer.observe(data["step"], time.monotonic(), created if isinstance(created, (int, float))
                                  else None)
                line = loss_line(data, timer.eta_s(data.get("step"), data.get("total_steps")))
                if live_line:
                    live.update(line, refresh=True)
                else:
                    loss_to.print(line, markup=False)
            elif not quiet:
                live.console.print(f"{output.when(event.get('created_at'))}  {event.get('message')}", markup=False)
    job = api.get(f"/fine_tuning/jobs/{job_id}")
    if not as_json:
        err.print(f"{job['id']}: {job['status']}" + (f" -> {job['fine_tuned_model']}" if job.get("fine_tuned_model")
                                                     else ""), markup=False)
    if job["status"] in ("failed", "cancelled"):
        reason = (job.get("error") or {}).get("message")
        raise CliFailure(f"{job_id} {job['status']}" + (f": {reason}" if reason else ""), EXIT_REFUSED)
