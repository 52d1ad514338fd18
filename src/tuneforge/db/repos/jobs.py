from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from tuneforge.db.engine import write_lock
from tuneforge.db.pagination import Page, newest_first
from tuneforge.db.tables import Checkpoint, Job
from tuneforge.db.tenancy import owned
from tuneforge.domain.status import TERMINAL, JobStatus


def get(session: Session, tenant_id: str, job_id: str) -> Job | None:
    return session.scalar(owned(Job, tenant_id).where(Job.job_id == job_id))


def get_many(session: Session, tenant_id: str, job_ids: list[str]) -> dict[str, Job]:
    """The tenant's jobs among `job_ids`, by id; another tenant's ids are simply absent."""
    if not job_ids:
        return {}
    return {job.job_id: job for job in session.scalars(owned(Job, tenant_id).where(Job.job_id.in_(job_ids)))}


def get_for_update(session: Session, job_id: str) -> Job | None:
    """Platform-side lookup (scheduler, trainer reports), row-locked on PostgreSQL; on SQLite the
    database's write lock is taken first, so that what is read here (a status checked before a
    transition) cannot change before the write that depends on it commits."""
    write_lock(session)
    return session.scalar(select(Job).where(Job.job_id == job_id).with_for_update())


def reread_for_update(session: Session, job: Job) -> Job:
    """`job` read afresh and row-locked on PostgreSQL, after the database's write lock on SQLite
    (see `get_for_update`), for a caller that already holds the row."""
    write_lock(session)
    session.refresh(job, with_for_update=True)
    return job


def status_of(session: Session, tenant_id: str, job_id: str) -> str | None:
    """Status read without the row (no lock), for streaming."""
    return session.scalar(owned(Job, tenant_id).with_only_columns(Job.status).where(Job.job_id == job_id))


def by_idempotency_key(session: Session, tenant_id: str, key: str) -> Job | None:
    return session.scalar(owned(Job, tenant_id).where(Job.idempotency_key == key))


def ending_with(session: Session, tenant_id: str, tag: str) -> list[Job]:
    """The tenant's jobs whose id ends with `tag`."""
    return list(session.scalars(owned(Job, tenant_id).where(Job.job_id.endswith(tag))))


def first_twin(session: Session, tenant_id: str, config_hash: str | None, job_id: str) -> Job | None:
    """The tenant's oldest job other than `job_id` with configuration hash `config_hash` that was
    not cancelled."""
    return session.scalars(owned(Job, tenant_id).where(
        Job.config_hash == config_hash, Job.job_id != job_id,
        Job.status != JobStatus.CANCELLED.value).order_by(Job.pk)).first()


def page(
    session: Session,
    tenant_id: str,
    *,
    metadata: dict[str, str],
    after: str | None,
    limit: int,
) -> Page:
    stmt = owned(Job, tenant_id)
    if metadata:
        # Metadata filters are rare and per tenant; filtering in Python keeps the
        # JSON semantics identical on SQLite and PostgreSQL.
        rows = [
            job
            for job in session.scalars(stmt.order_by(Job.pk.desc()))
            if all((job.user_metadata or {}).get(k) == v for k, v in metadata.items())
        ]
        if after:
            ids = [job.job_id for job in rows]
            rows = rows[ids.index(after) + 1:] if after in ids else []
        limit = max(1, min(limit, 100))
        return Page(rows=rows[:limit], has_more=len(rows) > limit)
    return newest_first(session, stmt, Job, Job.job_id, after, limit)


def with_status(session: Session, statuses: list[str]) -> list[Job]:
    return list(session.scalars(select(Job).where(Job.status.in_(statuses)).order_by(Job.pk)))


def count_in(session: Session, tenant_id: str, statuses: tuple[str, ...]) -> int:
    """How many of the tenant's jobs are in one of `statuses`."""
    stmt = select(func.count()).select_from(Job).where(Job.tenant_id == tenant_id, Job.status.in_(statuses))
    return int(session.scalar(stmt) or 0)


def count_in_by_tenant(session: Session, statuses: tuple[str, ...]) -> dict[str, int]:
    """tenant_id -> how many of its jobs are in one of `statuses`, in one query (platform-wide on
    purpose: for a scheduler tick over many tenants' jobs)."""
    rows = session.execute(
        select(Job.tenant_id, func.count()).where(Job.status.in_(statuses)).group_by(Job.tenant_id))
    return {tenant_id: int(count) for tenant_id, count in rows}


def count_waiting_before(session: Session, statuses: list[str], before_pk: int | None) -> int:
    """How many jobs of every tenant are in one of `statuses` and came before the job of pk
    `before_pk` (all of them when None): platform-wide on purpose, a place in the one queue."""
    stmt = select(func.count()).select_from(Job).where(Job.status.in_(statuses))
    if before_pk is not None:
        stmt = stmt.where(Job.pk < before_pk)
    return int(session.scalar(stmt) or 0)


def count_by_status(session: Session) -> dict[str, int]:
    rows = session.execute(select(Job.status, func.count()).group_by(Job.status))
    return {status: count for status, count in rows}


def failed_with_checkpoints(session: Session, finished_before: float, limit: int) -> list[Job]:
    """Failed jobs that ended before `finished_before` and still have checkpoint rows (any tenant:
    for the housekeeping that clears them)."""
    return list(session.scalars(
        select(Job).where(Job.status == JobStatus.FAILED.value, Job.finished_at < finished_before,
                          Job.job_id.in_(select(Checkpoint.job_id))).limit(limit)))


def unfinished_continuations(session: Session) -> list[Job]:
    """Every tenant's jobs that continue from a parent model and have not finished (platform-wide on
    purpose: the housekeeping that must not remove weights such a job reads)."""
    return list(session.scalars(select(Job).where(
        Job.parent.is_not(None), Job.status.not_in([status.value for status in TERMINAL]))).all())


def using_file(session: Session, tenant_id: str, file_id: str) -> list[Job]:
    """The tenant's jobs trained or validated on file `file_id`, oldest first."""
    return list(session.scalars(owned(Job, tenant_id).where(
        (Job.training_file == file_id) | (Job.validation_file == file_id)).order_by(Job.pk)))


def unfinished(session: Session, tenant_id: str) -> list[Job]:
    """The tenant's jobs that have not ended (a trainer may still read their datasets)."""
    terminal = [status.value for status in TERMINAL]
    return list(session.scalars(owned(Job, tenant_id).where(Job.status.not_in(terminal)).order_by(Job.pk)))
