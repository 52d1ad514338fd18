"""A job's events. Reads take the tenant and find nothing of another tenant's job
(`db/tenancy.of_job`); a write takes the job row its caller already holds.

Followers read a job's events in `pk` order and remember the last pk they saw
(the event streams, `since`), so a job's events must become visible in pk order:
see `_in_pk_order`. A transaction that adds events wakes the job's followers
when it commits (db/notify.py)."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from tuneforge.db import notify
from tuneforge.db.pagination import Page, newest_first
from tuneforge.db.tables import Job, JobEvent
from tuneforge.db.tenancy import of_job, owned_by_job
from tuneforge.domain.ids import new_id


def add(
    session: Session,
    job: Job,
    message: str,
    *,
    level: str = "info",
    event_type: str = "message",
    data: dict[str, Any] | None = None,
    attempt: int = 0,
    seq: int | None = None,
    created_at: int | None = None,
) -> JobEvent:
    _in_pk_order(session, job)
    event = JobEvent(
        event_id=new_id("ftevent"),
        job_id=job.job_id,
        attempt=attempt,
        seq=seq,
        level=level,
        event_type=event_type,
        message=message,
        data=data,
        created_at=int(created_at if created_at is not None else time.time()),
    )
    session.add(event)
    notify.event_added(session, job.job_id)
    return event


def _in_pk_order(session: Session, job: Job) -> None:
    """PostgreSQL hands out a pk at INSERT but shows the row at COMMIT: two transactions adding
    events of one job could commit out of pk order, and a follower that has read pk 11 would
    never see pk 10. Taking the job's row lock before the insert makes those transactions take
    turns, so a job's events commit in pk order. Most callers hold the lock already
    (`jobs.get_for_update`); then this costs one round trip. SQLite has one writer at a time."""
    if session.get_bind().dialect.name != "postgresql":
        return
    # no_autoflush: the lock comes before this transaction's pending rows are written, not after
    with session.no_autoflush:
        session.execute(select(Job.pk).where(Job.job_id == job.job_id).with_for_update())


# The newest event's key, of every tenant's jobs (platform-wide on purpose): every state change of
# every job writes an event, so it tells whether the queue may have changed (services/training/queue.py).
NEWEST_EVENT = select(func.max(JobEvent.pk))


def newest_pk(session: Session) -> int | None:
    """`NEWEST_EVENT`: the key of the newest event of any job (None while there is none)."""
    return session.scalar(NEWEST_EVENT)


def page(session: Session, tenant_id: str, job_id: str, *, after: str | None, limit: int) -> Page:
    stmt = owned_by_job(JobEvent, tenant_id, job_id)
    return newest_first(session, stmt, JobEvent, JobEvent.event_id, after, limit)


def pk_of(session: Session, tenant_id: str, job_id: str, event_id: str) -> int | None:
    """The pk of event `event_id` of this job; None when it is not one of this tenant's job's events."""
    return session.scalar(
        owned_by_job(JobEvent, tenant_id, job_id).with_only_columns(JobEvent.pk).where(JobEvent.event_id == event_id)
    )


def since(session: Session, tenant_id: str, job_id: str, after_pk: int, limit: int = 500) -> list[JobEvent]:
    """Events in chronological order after `after_pk` (for streaming)."""
    return list(
        session.scalars(
            owned_by_job(JobEvent, tenant_id, job_id)
            .where(JobEvent.pk > after_pk)
            .order_by(JobEvent.pk)
            .limit(limit)
        )
    )


def reported_seqs(session: Session, tenant_id: str, job_id: str, attempt: int, seqs: list[int]) -> set[int]:
    if not seqs:
        return set()
    rows = session.scalars(
        select(JobEvent.seq).where(
            of_job(JobEvent, tenant_id, job_id), JobEvent.attempt == attempt, JobEvent.seq.in_(seqs)
        )
    )
    return set(rows)


def metrics_rows(session: Session, tenant_id: str, job_id: str) -> list[JobEvent]:
    return list(
        session.scalars(
            owned_by_job(JobEvent, tenant_id, job_id)
            .where(JobEvent.event_type == "metrics")
            .order_by(JobEvent.pk)
        )
    )
