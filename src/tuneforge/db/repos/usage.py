"""The reads metering and the platform's gauges are computed from (services/tenancy/usage.py does the sums).

A tenant's GPU time is read with its `tenant_id`; the platform-wide reads (every tenant's attempts
for fair share and the admin's usage, the queue and GPU gauges of /metrics) say so where they are."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sqlalchemy import Select, func, or_, select
from sqlalchemy.orm import Session

from tuneforge.db.tables import Attempt, Job, JobEvent, MeteredTokens, Tenant
from tuneforge.domain.status import AttemptStatus, JobStatus

_IN_CHUNK = 1000  # ids per IN (...) list: far below SQLite's and PostgreSQL's parameter limits


def _attempts_between(start: float, end: float) -> Select:
    """Attempts that may hold GPU time in [start, end), each with its job, newest job first."""
    return (
        select(Attempt, Job)
        .join(Job, Job.job_id == Attempt.job_id)
        .where(Attempt.started_at < end, or_(Attempt.ended_at.is_(None), Attempt.ended_at >= start))
        .order_by(Job.pk.desc(), Attempt.number)
    )


def attempts_between(session: Session, tenant_id: str, start: float, end: float) -> list[tuple[Attempt, Job]]:
    """(attempt, job) of the tenant's attempts that may hold GPU time in [start, end): started
    before `end` and not ended before `start`; newest job first, then by attempt number."""
    stmt = _attempts_between(start, end).where(Job.tenant_id == tenant_id)
    return [(attempt, job) for attempt, job in session.execute(stmt)]


def every_tenants_attempts_between(session: Session, start: float, end: float) -> list[tuple[Attempt, Job]]:
    """`attempts_between` over every tenant (platform-wide on purpose: fair share, the admin's usage)."""
    return [(attempt, job) for attempt, job in session.execute(_attempts_between(start, end))]


def _chunks(items: Sequence[str], size: int) -> Iterable[Sequence[str]]:
    for offset in range(0, len(items), size):
        yield items[offset:offset + size]


def newest_queued_at(session: Session, job_ids: Sequence[str]) -> dict[str, float]:
    """job_id -> when the job last moved to `queued` (its newest control-plane event saying so);
    jobs without such an event are absent. Platform-wide on purpose: the ids are the queue's, of
    any tenant (the gauges of /metrics)."""
    latest: dict[str, float] = {}
    for chunk in _chunks(list(job_ids), _IN_CHUNK):
        rows = session.execute(
            select(JobEvent.job_id, func.max(JobEvent.created_at))
            .where(
                JobEvent.job_id.in_(chunk),
                JobEvent.seq.is_(None),  # control-plane events; trainer reports carry a seq
                JobEvent.data["status"].as_string() == JobStatus.QUEUED.value,
            )
            .group_by(JobEvent.job_id)
        )
        latest.update({job_id: float(at) for job_id, at in rows})
    return latest


def queued_jobs(session: Session) -> list[tuple[str, float, str]]:
    """(job_id, created_at, the tenant's tier) of every queued job (platform-wide on purpose: the
    queue gauges of /metrics)."""
    rows = session.execute(
        select(Job.job_id, Job.created_at, Tenant.tier)
        .join(Tenant, Tenant.tenant_id == Job.tenant_id)
        .where(Job.status == JobStatus.QUEUED.value)
    ).all()
    return [(job_id, created_at, tier) for job_id, created_at, tier in rows]


def gpus_held(session: Session, statuses: Sequence[str]) -> int:
    """GPUs held by the attempts in `statuses`, every tenant's (platform-wide on purpose: a gauge)."""
    busy = session.scalar(select(func.coalesce(func.sum(Attempt.gpus), 0)).where(Attempt.status.in_(statuses)))
    return int(busy or 0)


def preempted_attempts(session: Session) -> int:
    """Attempts ever preempted, every tenant's (platform-wide on purpose: a gauge)."""
    preempted = session.scalar(
        select(func.count()).select_from(Attempt).where(Attempt.status == AttemptStatus.PREEMPTED.value))
    return int(preempted or 0)


def gpu_seconds_by_status(session: Session, now: float) -> dict[str, float]:
    """attempt status -> GPU-seconds its attempts held (a running one's up to `now`; never below 0),
    every tenant's (platform-wide on purpose: a counter of /metrics). Statuses without attempts are absent."""
    held = func.sum(Attempt.gpus * (func.coalesce(Attempt.ended_at, now) - Attempt.started_at))
    return {status: max(0.0, float(total or 0.0)) for status, total in
            session.execute(select(Attempt.status, held).group_by(Attempt.status))}


def add_tokens(session: Session, row: MeteredTokens) -> None:
    session.add(row)


def tokens_between(session: Session, tenant_id: str, start: float,
                   end: float) -> list[tuple[str, str, str | None, int, int, int, float | None]]:
    """(kind, model, job_id, requests, prompt tokens, completion tokens, device seconds) of the
    tenant's metered tokens in [start, end), summed per kind, model and job."""
    rows = session.execute(
        select(MeteredTokens.kind, MeteredTokens.model, MeteredTokens.job_id, func.sum(MeteredTokens.requests),
               func.sum(MeteredTokens.prompt_tokens), func.sum(MeteredTokens.completion_tokens),
               func.sum(MeteredTokens.device_seconds))
        .where(MeteredTokens.tenant_id == tenant_id, MeteredTokens.created_at >= start,
               MeteredTokens.created_at < end)
        .group_by(MeteredTokens.kind, MeteredTokens.model, MeteredTokens.job_id)
        .order_by(MeteredTokens.kind, MeteredTokens.model, MeteredTokens.job_id))
    return [(kind, model, job_id, int(requests), int(prompt), int(completion),
             None if seconds is None else float(seconds))
            for kind, model, job_id, requests, prompt, completion, seconds in rows]
