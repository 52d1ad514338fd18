"""Metering: GPU-seconds per attempt, job, tenant and month; the platform's gauges.

An attempt is metered from its launch (`started_at`) to its end (`ended_at`,
or now while it runs), times its GPUs; time in the queue is free. Every figure
is computed from the attempt rows, never accumulated on the side: a report the
trainer retries, or a reconcile that runs twice, cannot count an attempt
twice, and each attempt is one row (unique job and number), so it is metered
exactly once.

Refunds are one rule, `is_refunded`: an attempt that ended by the platform's
fault (`failure_class` "platform": crash, lost host, launch error; or status
"lost") is metered but not billed. A preempted attempt is billed: the trainer
checkpoints before it stops, so the work it paid for is kept and the job
resumes from there. User errors and out-of-memory attempts are billed, and so
is an attempt whose report was refused (`report_refused`): the job fails at
once instead of being retried, and its text is the tenant's model's.

Months are calendar months in UTC. An attempt that spans a month boundary is
split at it, so each month holds exactly the GPU-time spent within it.

Tokens are metered beside GPU time where a tenant spends them on something
else: the judges its model graders ask (`meter_tokens`, one row per batch).
Each kind has its price per million tokens (`price_per_million_tokens`).
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from sqlalchemy.orm import Session

from tuneforge.db.repos import jobs as job_repo
from tuneforge.db.repos import usage as usage_repo
from tuneforge.db.repos import webhooks as webhook_repo
from tuneforge.db.tables import Attempt, MeteredTokens
from tuneforge.domain.errors import invalid
from tuneforge.domain.status import ATTEMPT_ACTIVE, AttemptStatus, JobStatus
from tuneforge.services.context import Platform

REFUNDED_FAILURE_CLASSES = frozenset({"platform"})
# training.train: tokens through forward_backward of the training API; training.sample: its samples
# (prompt tokens prefilled, completion tokens sampled)
TOKEN_KINDS = ("judge.served", "judge.operator", "judge.tenant", "training.train", "training.sample")
_ACTIVE = tuple(status.value for status in ATTEMPT_ACTIVE)
_MONTH = re.compile(r"^(\d{4})-(0[1-9]|1[0-2])$")


# ---- months ------------------------------------------------------------------
def current_month(now: float) -> str:
    """The calendar month (UTC) that `now` falls in, as YYYY-MM."""
    return datetime.fromtimestamp(now, tz=timezone.utc).strftime("%Y-%m")


def parse_month(text: str) -> str:
    """A client's `month`, checked: YYYY-MM from 1970 on."""
    match = _MONTH.match(text.strip())
    if match is None or int(match.group(1)) < 1970:
        raise invalid(f"month must be a calendar month as YYYY-MM, e.g. 2026-11; got {text!r}",
                      param="month", code="invalid_value")
    return match.group(0)


def month_bounds(month: str) -> tuple[float, float]:
    """[start, end) of a calendar month in UTC, as unix seconds."""
    year, number = int(month[:4]), int(month[5:7])
    start = calendar.timegm((year, number, 1, 0, 0, 0))
    # by the month's length rather than the next month's first day: December 9999 has no next month
    days = calendar.monthrange(year, number)[1]
    return float(start), float(start + days * 86400)


# ---- one attempt ---------------------------------------------------------------
def is_refunded(attempt: Attempt) -> bool:
    """An attempt the platform lost is not billed (the job retries it at the platform's expense)."""
    return attempt.failure_class in REFUNDED_FAILURE_CLASSES or attempt.status == AttemptStatus.LOST.value


def attempt_end(attempt: Attempt, now: float) -> float:
    """When the attempt stopped holding its GPUs: its end; now while it is active; for an
    attempt closed without an end time, its last heartbeat (the last moment it was alive)."""
    if attempt.ended_at is not None:
        return attempt.ended_at
    if attempt.status in _ACTIVE:
        return now
    return attempt.heartbeat_at


def gpu_seconds(attempt: Attempt, now: float, start: float = float("-inf"), end: float = float("inf")) -> float:
    """GPUs x the attempt's time inside [start, end)."""
    held_s = min(attempt_end(attempt, now), end) - max(attempt.started_at, start)
    return max(0.0, held_s) * max(0, attempt.gpus)


def _overlaps(attempt: Attempt, now: float, start: float, end: float) -> bool:
    # an attempt that ended the instant it started (a failed launch) still belongs to its month
    return attempt.started_at < end and attempt_end(attempt, now) >= start


def default_price(settings: Any) -> float:
    """A GPU-hour's price where no capacity pool sets one (TUNEFORGE_PRICE_PER_GPU_HOUR)."""
    table = settings.price_per_gpu_hour
    return float(table.get(settings.gpu_type, table.get("default", 0.0)))


def attempt_prices(attempt: Attempt) -> tuple[float, float]:
    """(price per GPU-hour where the attempt ran, the on-demand price of the same GPU-hour), as
    recorded at its launch (0 for attempts launched before prices were recorded)."""
    placement = attempt.placement or {}
    price = float(placement.get("price_per_gpu_hour") or 0.0)
    return price, float(placement.get("on_demand_price_per_gpu_hour") or price)


@dataclass
class Metered:
    """GPU-seconds of some attempts, split into billed and refunded, and what the billed ones
    cost at their pools' prices (and would have cost on demand)."""

    billable_gpu_seconds: float = 0.0
    refunded_gpu_seconds: float = 0.0
    attempts: int = 0
    cost: float = 0.0
    on_demand_cost: float = 0.0

    @property
    def gpu_seconds(self) -> float:
        return self.billable_gpu_seconds + self.refunded_gpu_seconds

    @property
    def saving(self) -> float:
        return self.on_demand_cost - self.cost

    def add(self, attempt: Attempt, now: float, start: float, end: float) -> None:
        seconds = gpu_seconds(attempt, now, start, end)
        if is_refunded(attempt):
            self.refunded_gpu_seconds += seconds
        else:
            self.billable_gpu_seconds += seconds
            price, on_demand = attempt_prices(attempt)
            self.cost += seconds / 3600 * price
            self.on_demand_cost += seconds / 3600 * on_demand
        self.attempts += 1


@dataclass
class JobUsage:
    job_id: str
    model: str
    status: str
    metered: Metered = field(default_factory=Metered)


# ---- sums ------------------------------------------------------------------------
def jobs_usage(session: Session, tenant_id: str, month: str, now: float) -> list[JobUsage]:
    """The tenant's jobs that held GPUs in `month`, newest job first, each with its GPU-seconds there."""
    start, end = month_bounds(month)
    by_job: dict[str, JobUsage] = {}
    for attempt, job in usage_repo.attempts_between(session, tenant_id, start, end):
        if _overlaps(attempt, now, start, end):
            usage = by_job.setdefault(job.job_id, JobUsage(job.job_id, job.model, job.status))
            usage.metered.add(attempt, now, start, end)
    return list(by_job.values())  # insertion order is the query's: newest job first


def usage_by_tenant(session: Session, start: float, end: float, now: float) -> dict[str, Metered]:
    """Every tenant's GPU-seconds in [start, end); tenants without any are absent.
    Also the input of fair share over a sliding window (start = now - window)."""
    totals: dict[str, Metered] = {}
    for attempt, job in usage_repo.every_tenants_attempts_between(session, start, end):
        if _overlaps(attempt, now, start, end):
            totals.setdefault(job.tenant_id, Metered()).add(attempt, now, start, end)
    return totals


def tenant_usage(session: Session, tenant_id: str, start: float, end: float, now: float) -> Metered:
    metered = Metered()
    for attempt, _job in usage_repo.attempts_between(session, tenant_id, start, end):
        if _overlaps(attempt, now, start, end):
            metered.add(attempt, now, start, end)
    return metered


# ---- platform gauges (/metrics) --------------------------------------------------------
@dataclass(frozen=True)
class Snapshot:
    queue_depth: dict[str, int]  # tier -> queued jobs
    oldest_wait_s: dict[str, float]  # tier -> time in the queue of its longest-waiting job (0 when none)
    running_jobs: int
    gpus_total: int | None  # None: this process cannot see the executor's inventory (Platform.capacity)
    gpus_busy: int  # GPUs held by starting or running attempts
    preemptions: int  # attempts ever preempted
    jobs_by_status: dict[str, int]

    @property
    def gpu_utilization(self) -> float | None:
        if self.gpus_total is None:
            return None
        return self.gpus_busy / self.gpus_total if self.gpus_total > 0 else 0.0


def queued_since(session: Session, created_at: dict[str, float]) -> dict[str, float]:
    """When each job (job_id -> created_at) last entered the queue: its newest transition to
    `queued` (after validation, a restart or a resume), else its creation. A restarted job
    waits from its requeue, not from its creation."""
    latest = usage_repo.newest_queued_at(session, list(created_at))
    return {job_id: latest.get(job_id, float(created)) for job_id, created in created_at.items()}


def platform_snapshot(session: Session, platform: Platform, tiers: Sequence[str], now: float) -> Snapshot:
    """The gauges of /metrics, GPUs counted in the capacity this process knows."""
    capacity = platform.capacity()
    return snapshot(session, tiers, None if capacity is None else int(capacity.total_gpus), now)


def snapshot(session: Session, tiers: Sequence[str], gpus_total: int | None, now: float) -> Snapshot:
    queued = usage_repo.queued_jobs(session)
    since = queued_since(session, {job_id: float(created) for job_id, created, _tier in queued})
    depth = {tier: 0 for tier in tiers}
    oldest = {tier: 0.0 for tier in tiers}
    for job_id, _created, tier in queued:
        depth[tier] = depth.get(tier, 0) + 1
        oldest[tier] = max(oldest.get(tier, 0.0), now - since[job_id])
    by_status = {status.value: 0 for status in JobStatus}
    by_status.update(job_repo.count_by_status(session))
    return Snapshot(
        queue_depth=depth, oldest_wait_s=oldest, running_jobs=by_status[JobStatus.RUNNING.value],
        gpus_total=gpus_total, gpus_busy=usage_repo.gpus_held(session, _ACTIVE),
        preemptions=usage_repo.preempted_attempts(session),
        jobs_by_status=by_status,
    )


def counters(session: Session, now: float) -> dict[str, dict[str, float]]:
    """Platform-wide totals for /metrics: GPU-seconds attempts held, by attempt status (a running
    attempt's so far), and webhook deliveries by status."""
    gpu_seconds = {status.value: 0.0 for status in AttemptStatus}
    gpu_seconds.update(usage_repo.gpu_seconds_by_status(session, now))
    deliveries = {"pending": 0.0, "delivered": 0.0, "failed": 0.0}
    deliveries.update({status: float(count) for status, count in webhook_repo.deliveries_by_status(session).items()})
    return {"gpu_seconds": gpu_seconds, "webhook_deliveries": deliveries}



# ---- tokens ------------------------------------------------------------------------
def meter_tokens(session: Session, tenant_id: str, job_id: str | None, kind: str, model: str, *, requests: int,
                 prompt_tokens: int, completion_tokens: int, now: float, device_seconds: float | None = None) -> None:
    """One batch of tokens the tenant spent (`kind`: one of TOKEN_KINDS), and the share of a shared
    device's time it took where it ran on one of the platform's."""
    assert kind in TOKEN_KINDS, kind
    usage_repo.add_tokens(session, MeteredTokens(
        tenant_id=tenant_id, job_id=job_id, kind=kind, model=model[:256], requests=requests,
        prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, created_at=int(now),
        device_seconds=device_seconds))


def tokens_usage(session: Session, settings: Any, tenant_id: str, month: str) -> list[dict[str, Any]]:
    """The tenant's metered tokens in `month`, per kind, model and job, each with its cost."""
    start, end = month_bounds(month)
    prices = settings.price_per_million_tokens
    hour = float(settings.price_per_gpu_hour.get(settings.gpu_type, 0.0))
    return [{"object": "usage.tokens", "kind": kind, "model": model, "job_id": job_id, "requests": requests,
             "prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
             "device_seconds": None if seconds is None else round(seconds, 6),
             "cost": round((prompt + completion) / 1e6 * float(prices.get(kind, 0.0)) + (seconds or 0.0) / 3600 * hour,
                           6)}
            for kind, model, job_id, requests, prompt, completion, seconds
            in usage_repo.tokens_between(session, tenant_id, start, end)]
