"""Tiers and quotas: the limits a tenant runs under, and every check of them.

A tier gives defaults (`TIER_DEFAULTS`); a tenant's own quota column overrides
one of them: NULL takes the tier's default, `UNLIMITED` (-1) lifts the limit,
0 or more is the limit. The rules, all here:

- admission (`check_admission`, called by job create before the row exists):
  this month's billable GPU-hours at or above the hard cap answer 403
  `quota_exceeded`; as many waiting jobs (queued or validating) as
  `max_queued_jobs` answer 429 `too_many_queued_jobs`. Both refuse the request
  and leave nothing behind; the tenant can retry once a job has started or the
  month has turned.
- start (`can_start`, asked by the scheduler before it launches a queued job):
  fewer jobs holding compute (running or evaluating) than
  `max_concurrent_jobs`.
- the soft allowance is never enforced: usage past it is allowed and flagged
  (`over_soft_allowance` in GET /v1/usage and `tuneforge tenants usage`).

GPU-hours are billable hours (refunded attempts excluded, see
`services/usage.py`) in the current calendar month, UTC. The hard cap is
checked when a job is created: a job admitted under the cap runs to its end
even if it crosses the cap; `hard_cap_reached` lets the scheduler hold queued
jobs too if that is wanted.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, fields
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from tuneforge.db.tables import Job, Tenant
from tuneforge.domain.errors import invalid, quota_exceeded, rate_limited
from tuneforge.domain.status import JobStatus
from tuneforge.services import usage


@dataclass(frozen=True)
class Limits:
    """What a tenant may use; None means no limit."""

    max_concurrent_jobs: int | None  # jobs running (or evaluating) at once
    max_queued_jobs: int | None  # jobs waiting (queued or validating their files) at once
    gpu_hours_hard: float | None  # billable GPU-hours per calendar month; new jobs are refused at the cap
    gpu_hours_soft: float | None  # allowance per month; usage past it is allowed and flagged


# Free is a trial: one job at a time and a small monthly budget. Standard fits a
# team fine-tuning daily (500 GPU-h is about 4 GPUs busy a third of the month).
# Premium is bounded by concurrency and its queue only; its soft allowance is
# where a conversation about capacity starts.
TIER_DEFAULTS: dict[str, Limits] = {
    "free": Limits(max_concurrent_jobs=1, max_queued_jobs=3, gpu_hours_hard=10.0, gpu_hours_soft=5.0),
    "standard": Limits(max_concurrent_jobs=4, max_queued_jobs=20, gpu_hours_hard=500.0, gpu_hours_soft=300.0),
    "premium": Limits(max_concurrent_jobs=16, max_queued_jobs=100, gpu_hours_hard=None, gpu_hours_soft=5000.0),
}
UNLIMITED = -1  # stored in a quota column: no limit for this tenant, whatever its tier
QUOTA_FIELDS = tuple(f.name for f in fields(Limits))
_COUNT_FIELDS = frozenset({"max_concurrent_jobs", "max_queued_jobs"})
WAITING = (JobStatus.QUEUED.value, JobStatus.VALIDATING_FILES.value)
HOLDING = (JobStatus.RUNNING.value, JobStatus.EVALUATING.value)


def limits(tenant: Tenant) -> Limits:
    """The tenant's effective limits: its overrides over its tier's defaults.
    An unknown tier gets the free tier's, the least a tenant can have."""
    defaults = TIER_DEFAULTS.get(tenant.tier, TIER_DEFAULTS["free"])
    values: dict[str, Any] = {}
    for name in QUOTA_FIELDS:
        override = getattr(tenant, name)
        if override is None:
            values[name] = getattr(defaults, name)
        elif override < 0:
            values[name] = None
        else:
            values[name] = int(override) if name in _COUNT_FIELDS else float(override)
    return Limits(**values)


def checked_override(name: str, value: float | None) -> int | float | None:
    """A value for quota column `name`, as stored: None (tier default), UNLIMITED, or a limit >= 0
    (whole numbers for job counts)."""
    if name not in QUOTA_FIELDS:
        raise invalid(f"unknown quota {name!r}; quotas are {', '.join(QUOTA_FIELDS)}", param=name)
    if value is None:
        return None
    if value == UNLIMITED:
        return UNLIMITED
    if not math.isfinite(value) or value < 0:
        raise invalid(f"{name} must be 0 or more (or unlimited); got {value}", param=name)
    if name in _COUNT_FIELDS:
        if value != int(value):
            raise invalid(f"{name} must be a whole number of jobs; got {value}", param=name)
        return int(value)
    return float(value)


# ---- counts ------------------------------------------------------------------------
def _jobs_of(session: Session, tenant_id: str, statuses: tuple[str, ...]) -> int:
    stmt = select(func.count()).select_from(Job).where(Job.tenant_id == tenant_id, Job.status.in_(statuses))
    return int(session.scalar(stmt) or 0)


def waiting_jobs(session: Session, tenant_id: str) -> int:
    return _jobs_of(session, tenant_id, WAITING)


def running_jobs(session: Session, tenant_id: str) -> int:
    return _jobs_of(session, tenant_id, HOLDING)


def running_counts(session: Session) -> dict[str, int]:
    """tenant_id -> jobs holding compute, in one query (for a scheduler tick over many jobs)."""
    rows = session.execute(
        select(Job.tenant_id, func.count()).where(Job.status.in_(HOLDING)).group_by(Job.tenant_id))
    return {tenant_id: int(count) for tenant_id, count in rows}


def billable_gpu_hours(session: Session, tenant: Tenant, now: float) -> float:
    """Billable GPU-hours of the tenant in the current calendar month (UTC)."""
    start, end = usage.month_bounds(usage.current_month(now))
    return usage.tenant_usage(session, tenant.tenant_id, start, end, now).billable_gpu_seconds / 3600.0


# ---- the checks ------------------------------------------------------------------------
def can_start(session: Session, tenant: Tenant) -> bool:
    """May one more of the tenant's queued jobs start now? (jobs running < max_concurrent_jobs)"""
    cap = limits(tenant).max_concurrent_jobs
    return cap is None or running_jobs(session, tenant.tenant_id) < cap


def hard_cap_reached(session: Session, tenant: Tenant, now: float | None = None) -> bool:
    cap = limits(tenant).gpu_hours_hard
    now = time.time() if now is None else now
    return cap is not None and billable_gpu_hours(session, tenant, now) >= cap


def check_admission(session: Session, tenant: Tenant, now: float | None = None) -> None:
    """Raise the API error that refuses a new job of this tenant, if any.

    No lock is taken: the create request validates small jobs inline in the
    same transaction, so a lock on the tenant would serialise its creates for
    seconds. Creates racing each other can therefore pass the queue limit by
    the number in flight at that instant, which a rate guard tolerates; the
    GPU-hour cap depends on usage, not on other creates, and has no race."""
    now = time.time() if now is None else now
    quota = limits(tenant)
    if quota.gpu_hours_hard is not None:
        used_h = billable_gpu_hours(session, tenant, now)
        if used_h >= quota.gpu_hours_hard:
            raise quota_exceeded(
                f"This month's GPU-hour quota is used up: {used_h:.2f} of {quota.gpu_hours_hard:g} GPU-hours "
                f"({usage.current_month(now)}, UTC). New jobs are accepted again next month or once the "
                "quota is raised.")
    if quota.max_queued_jobs is not None:
        waiting = waiting_jobs(session, tenant.tenant_id)
        if waiting >= quota.max_queued_jobs:
            raise rate_limited(
                f"Too many jobs waiting: {waiting} queued or validating, the limit is {quota.max_queued_jobs}. "
                "Retry once one of them has started, or cancel one.", code="too_many_queued_jobs")


# ---- standing ----------------------------------------------------------------------------
def totals(tenant: Tenant, month: str, metered: usage.Metered) -> dict[str, Any]:
    """A tenant's month in GPU-hours next to its allowance and cap (the current ones: limits
    have no history, so a past month is judged by today's limits)."""
    quota = limits(tenant)
    billable_h = metered.billable_gpu_seconds / 3600.0
    return {
        "month": month,
        "gpu_hours": round(metered.gpu_seconds / 3600.0, 6),
        "billable_gpu_hours": round(billable_h, 6),
        "refunded_gpu_hours": round(metered.refunded_gpu_seconds / 3600.0, 6),
        "gpu_hours_soft": quota.gpu_hours_soft,
        "gpu_hours_hard": quota.gpu_hours_hard,
        "over_soft_allowance": quota.gpu_hours_soft is not None and billable_h > quota.gpu_hours_soft,
        "hard_cap_reached": quota.gpu_hours_hard is not None and billable_h >= quota.gpu_hours_hard,
    }


def month_totals(session: Session, tenant: Tenant, month: str, now: float) -> dict[str, Any]:
    start, end = usage.month_bounds(month)
    return totals(tenant, month, usage.tenant_usage(session, tenant.tenant_id, start, end, now))
