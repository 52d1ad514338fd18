"""Tiers and quotas: the limits a tenant runs under, and every check of them.

A tier gives defaults (`TIER_DEFAULTS`); a tenant's own quota column overrides
one of them: NULL takes the tier's default, `UNLIMITED` (-1) lifts the limit,
0 or more is the limit. Every check is one function, `refusal(limits, standing,
action)`; the rules it applies:

- "create" — admission (`check_admission`, called by job create before the row
  exists): this month's billable GPU-hours at or above the hard cap answer 403
  `quota_exceeded`; as many waiting jobs (queued or validating) as
  `max_queued_jobs` answer 429 `quota_exceeded` (type `rate_limit_error`). Both refuse the request
  and leave nothing behind; the tenant can retry once a job has started or the
  month has turned.
- "start" — the scheduler's start decision (`start_gate`, one per tick; for a
  single tenant `can_start`): fewer jobs holding compute (running or
  evaluating) than `max_concurrent_jobs`.
- the soft allowance is never enforced: usage past it is allowed and flagged
  (`over_soft_allowance` in GET /v1/usage and `tuneforge tenants usage`).
- "create" is also what every other transition that adds a waiting job asks: a paused job
  resumed (`jobs.resume_job`), a continued model and a sweep trial (both are creates).
  Requeues the platform makes (a preempted or retried attempt) are not refused: they move a
  job from holding to waiting, so waiting jobs stay under max_queued_jobs + max_concurrent_jobs.

Storage (the tier's `StorageQuota`, settings `storage_quotas`); the checks of files and uploads
run under the tenant's row lock so parallel requests cannot race past them, the artifacts' before
it (they grow by trainers' writes, not by the requests that check them):

- one object larger than a quota could ever hold: 413 `file_too_large`;
- files (every purpose) past `file_bytes`, or artifacts past `artifact_bytes` at job create or
  resume: 403 `storage_quota_exceeded` (type `insufficient_quota`): deleting cures it, waiting
  does not;
- pending uploads past `pending_uploads`, or their declared bytes past `pending_upload_bytes`:
  429 `too_many_pending_uploads` / `pending_upload_bytes_exceeded` with Retry-After until the
  oldest pending upload expires (completing or cancelling one cures it sooner).

GPU-hours are billable hours (refunded attempts excluded, see
`services/tenancy/usage.py`) in the current calendar month, UTC. The hard cap is
checked when a job is created: a job admitted under the cap runs to its end
even if it crosses the cap; `hard_cap_reached` lets the scheduler hold queued
jobs too if that is wanted.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal

from sqlalchemy.orm import Session

from tuneforge.db.repos import files as file_repo
from tuneforge.db.repos import jobs as job_repo
from tuneforge.db.repos import tenants as tenant_repo
from tuneforge.db.repos import uploads as upload_repo
from tuneforge.db.tables import Tenant
from tuneforge.domain.errors import ApiError, invalid, quota_exceeded, rate_limited
from tuneforge.domain.status import JobStatus
from tuneforge.services.tenancy import usage
from tuneforge.settings import Settings
from tuneforge.settings.money import StorageQuota
from tuneforge.storage import layout
from tuneforge.storage.store import ObjectStore


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
    return job_repo.count_in(session, tenant_id, statuses)


def waiting_jobs(session: Session, tenant_id: str) -> int:
    return _jobs_of(session, tenant_id, WAITING)


def running_jobs(session: Session, tenant_id: str) -> int:
    return _jobs_of(session, tenant_id, HOLDING)


def running_counts(session: Session) -> dict[str, int]:
    """tenant_id -> jobs holding compute, in one query (for a scheduler tick over many jobs)."""
    return job_repo.count_in_by_tenant(session, HOLDING)


def billable_gpu_hours(session: Session, tenant: Tenant, now: float) -> float:
    """Billable GPU-hours of the tenant in the current calendar month (UTC)."""
    start, end = usage.month_bounds(usage.current_month(now))
    return usage.tenant_usage(session, tenant.tenant_id, start, end, now).billable_gpu_seconds / 3600.0


# ---- the rule ------------------------------------------------------------------------------
Action = Literal["create", "start"]


@dataclass(frozen=True)
class Standing:
    """What a tenant holds now, as far as a check needs it (fields a check does not read stay 0)."""

    holding: int = 0  # jobs holding compute (running or evaluating)
    waiting: int = 0  # jobs waiting (queued or validating their files)
    gpu_hours: float = 0.0  # billable GPU-hours this calendar month


@dataclass(frozen=True)
class Refusal:
    """The limit that refuses an action, with what is used and what is allowed."""

    limit: str  # a field of Limits
    used: float
    allowed: float


def reached(allowed: float | None, used: float) -> bool:
    """A limit is reached at equality; no limit (None) never is."""
    return allowed is not None and used >= allowed


def refusal(quota: Limits, standing: Standing, action: Action) -> Refusal | None:
    """Every quota decision, in one place: what refuses `action` for a tenant with `quota`
    at `standing`, or None.

    - "create" (a new job, at admission): the monthly GPU-hour hard cap first, then the
      number of waiting jobs (`max_queued_jobs`).
    - "start" (a queued job, by the scheduler): the number of jobs holding compute
      (`max_concurrent_jobs`). The hard cap is not checked here: a job admitted under the
      cap runs to its end even if it crosses the cap.
    """
    if action == "create":
        if reached(quota.gpu_hours_hard, standing.gpu_hours):
            return Refusal("gpu_hours_hard", standing.gpu_hours, quota.gpu_hours_hard)
        if reached(quota.max_queued_jobs, standing.waiting):
            return Refusal("max_queued_jobs", standing.waiting, quota.max_queued_jobs)
        return None
    if action == "start":
        if reached(quota.max_concurrent_jobs, standing.holding):
            return Refusal("max_concurrent_jobs", standing.holding, quota.max_concurrent_jobs)
        return None
    raise ValueError(f"unknown quota action {action!r}")


# ---- the checks, with what they need read from the database ---------------------------------
def check_admission(session: Session, tenant: Tenant, now: float | None = None) -> None:
    """Raise the API error that refuses a new job of this tenant, if any.

    The caller holds the tenant's row lock (`tenant_repo.lock`) until its
    transaction commits, so creates racing each other are counted one after
    the other and none passes a limit another has just reached. Both refusals
    carry `code: quota_exceeded`: 429 (`rate_limit_error`) for the queue cap,
    which waiting cures, 403 (`insufficient_quota`) for the month's GPU-hours,
    which it does not."""
    now = time.time() if now is None else now
    quota = limits(tenant)
    standing = Standing(
        waiting=waiting_jobs(session, tenant.tenant_id) if quota.max_queued_jobs is not None else 0,
        gpu_hours=billable_gpu_hours(session, tenant, now) if quota.gpu_hours_hard is not None else 0.0)
    refused = refusal(quota, standing, "create")
    if refused is None:
        return
    if refused.limit == "gpu_hours_hard":
        raise quota_exceeded(
            f"This month's GPU-hour quota is used up: {refused.used:.2f} of {refused.allowed:g} GPU-hours "
            f"({usage.current_month(now)}, UTC). New jobs are accepted again next month or once the "
            "quota is raised.")
    raise rate_limited(
        f"Too many jobs waiting: {int(refused.used)} queued or validating, the limit is {int(refused.allowed)}. "
        "Retry once one of them has started, or cancel one.", code="quota_exceeded")


def start_gate(session: Session, holding: Mapping[str, int]) -> Callable[[str], bool]:
    """The scheduler's start check for one tick: `gate(tenant_id)` says whether another
    queued job of the tenant may start, given `holding` (tenant_id -> jobs holding compute
    as the scheduler sees them) plus the starts this gate has already allowed in the tick
    (the policy starts a job when the gate says yes and the job fits). A tenant without a
    row has no limits."""
    quotas = {tenant.tenant_id: limits(tenant) for tenant in tenant_repo.list_all(session)}
    counts = Counter(holding)

    def gate(tenant_id: str) -> bool:
        quota = quotas.get(tenant_id)
        if quota is not None and refusal(quota, Standing(holding=counts[tenant_id]), "start") is not None:
            return False
        counts[tenant_id] += 1
        return True

    return gate


def can_start(session: Session, tenant: Tenant) -> bool:
    """May one more of the tenant's queued jobs start now? (its running and evaluating jobs
    against max_concurrent_jobs)"""
    return refusal(limits(tenant), Standing(holding=running_jobs(session, tenant.tenant_id)), "start") is None


def hard_cap_reached(session: Session, tenant: Tenant, now: float | None = None) -> bool:
    now = time.time() if now is None else now
    return reached(limits(tenant).gpu_hours_hard, billable_gpu_hours(session, tenant, now))


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
        "hard_cap_reached": reached(quota.gpu_hours_hard, billable_h),
    }


def month_totals(session: Session, tenant: Tenant, month: str, now: float) -> dict[str, Any]:
    start, end = usage.month_bounds(month)
    return totals(tenant, month, usage.tenant_usage(session, tenant.tenant_id, start, end, now))


# ---- storage -----------------------------------------------------------------------------------
def storage_quota(settings: Settings, tenant: Tenant) -> StorageQuota:
    return settings.storage_quota(tenant.tier)


def file_bytes(session: Session, tenant_id: str) -> int:
    """Bytes of the tenant's files, every purpose (results files too)."""
    return file_repo.total_bytes(session, tenant_id)


@dataclass(frozen=True)
class PendingUploads:
    count: int
    declared_bytes: int
    next_expiry: int | None  # unix seconds when the oldest of them expires


def pending_uploads(session: Session, tenant_id: str, now: float) -> PendingUploads:
    return PendingUploads(*upload_repo.pending_totals(session, tenant_id, int(now)))


def artifact_bytes(store: ObjectStore, tenant_id: str) -> int:
    """Bytes the tenant's jobs hold in the store: checkpoints, final artifacts, copied parents."""
    return sum(store.size_bytes(key) for key in store.list(layout.tenant_jobs_prefix(tenant_id)))


def _too_large(what: str, size_bytes: int, quota_bytes: int) -> ApiError:
    return ApiError(413, f"{what} of {size_bytes} bytes is larger than the tenant's whole storage quota of "
                         f"{quota_bytes} bytes", param="file", code="file_too_large")


def check_file_bytes(session: Session, settings: Settings, tenant: Tenant, adding_bytes: int) -> None:
    """Refuse a new file of `adding_bytes` that takes the tenant past its `file_bytes`. The caller
    holds the tenant's lock (`tenant_repo.lock`) until the file's row is committed."""
    quota = storage_quota(settings, tenant).file_bytes
    if quota is None:
        return
    if adding_bytes > quota:
        raise _too_large("a file", adding_bytes, quota)
    used = file_bytes(session, tenant.tenant_id)
    if used + adding_bytes > quota:
        raise quota_exceeded(
            f"Storage quota reached: your files hold {used} bytes and this one {adding_bytes}; the quota is {quota} "
            "bytes. Delete files you no longer need.", code="storage_quota_exceeded")


def check_pending_upload(session: Session, settings: Settings, tenant: Tenant, declared_bytes: int,
                         now: float) -> None:
    """Refuse an Upload declaring `declared_bytes` beyond the tier's pending uploads (count and bytes)
    or its file quota; the caller holds the tenant's lock until the upload's row is committed."""
    quota = storage_quota(settings, tenant)
    for limit in (quota.pending_upload_bytes, quota.file_bytes):
        if limit is not None and declared_bytes > limit:
            raise _too_large("an upload", declared_bytes, limit)
    pending = pending_uploads(session, tenant.tenant_id, now)
    retry_after = max(1, (pending.next_expiry or int(now)) - int(now))
    if quota.pending_uploads is not None and pending.count >= quota.pending_uploads:
        raise rate_limited(f"You have {pending.count} pending uploads, the most allowed; complete or cancel one "
                           "first.", code="too_many_pending_uploads", retry_after=retry_after)
    limit = quota.pending_upload_bytes
    if limit is not None and pending.declared_bytes + declared_bytes > limit:
        raise rate_limited(f"Your pending uploads declare {pending.declared_bytes} bytes; {declared_bytes} more "
                           f"would pass the {limit} allowed. Complete or cancel one first.",
                           code="pending_upload_bytes_exceeded", retry_after=retry_after)
    check_file_bytes(session, settings, tenant, declared_bytes)  # it would not fit once completed either


def check_artifacts(settings: Settings, store: ObjectStore | None, tenant: Tenant) -> None:
    """Refuse a job (create, resume) while the tenant's jobs hold `artifact_bytes` or more."""
    quota = storage_quota(settings, tenant).artifact_bytes
    if quota is None or store is None:
        return
    used = artifact_bytes(store, tenant.tenant_id)
    if used >= quota:
        raise quota_exceeded(
            f"Storage quota reached: your jobs' checkpoints and models hold {used} bytes, the quota is {quota} "
            "bytes. Delete models or jobs' checkpoints you no longer need.", code="storage_quota_exceeded")


def storage_standing(session: Session, settings: Settings, store: ObjectStore, tenant: Tenant,
                     now: float) -> dict[str, Any]:
    """What the tenant keeps against its storage quotas (null: no limit), as GET /v1/usage shows it."""
    quota = storage_quota(settings, tenant)
    pending = pending_uploads(session, tenant.tenant_id, now)
    return {
        "file_bytes": file_bytes(session, tenant.tenant_id), "file_bytes_quota": quota.file_bytes,
        "pending_uploads": pending.count, "pending_uploads_quota": quota.pending_uploads,
        "pending_upload_bytes": pending.declared_bytes, "pending_upload_bytes_quota": quota.pending_upload_bytes,
        "artifact_bytes": artifact_bytes(store, tenant.tenant_id), "artifact_bytes_quota": quota.artifact_bytes,
    }
