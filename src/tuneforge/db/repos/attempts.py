"""A job's attempts. Reads of one job's attempts take the tenant and find nothing of
another tenant's job (`db/tenancy.owned_by_job`); the scans over every tenant's
attempts (`active`, `ended_since`) are the scheduler's and name each attempt's tenant."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from tuneforge.db.tables import Attempt, Job
from tuneforge.db.tenancy import owned_by_job
from tuneforge.domain.status import ATTEMPT_ACTIVE


def current(session: Session, tenant_id: str, job_id: str, number: int) -> Attempt | None:
    return session.scalar(owned_by_job(Attempt, tenant_id, job_id).where(Attempt.number == number))


def for_job(session: Session, tenant_id: str, job_id: str) -> list[Attempt]:
    return list(session.scalars(owned_by_job(Attempt, tenant_id, job_id).order_by(Attempt.number)))


def for_jobs(session: Session, tenant_id: str, job_ids: list[str]) -> list[Attempt]:
    """The attempts of those of `job_ids` that are `tenant_id`'s jobs."""
    if not job_ids:
        return []
    tenants_jobs = select(Job.job_id).where(Job.job_id.in_(job_ids), Job.tenant_id == tenant_id)
    return list(session.scalars(select(Attempt).where(Attempt.job_id.in_(tenants_jobs)).order_by(Attempt.pk)))


def active(session: Session) -> list[Attempt]:
    """Every tenant's starting or running attempts (platform-side: the scheduler's)."""
    return list(
        session.scalars(
            select(Attempt)
            .where(Attempt.status.in_([s.value for s in ATTEMPT_ACTIVE]))
            .order_by(Attempt.pk)
        )
    )


def ended_since(session: Session, since: float) -> list[tuple[str, Attempt]]:
    """(tenant_id, attempt) of every attempt that ended after `since` (epoch seconds),
    oldest first (platform-side: the scheduler's)."""
    rows = session.execute(
        select(Job.tenant_id, Attempt).join(Job, Job.job_id == Attempt.job_id)
        .where(Attempt.ended_at.is_not(None), Attempt.ended_at > since).order_by(Attempt.pk))
    return [(tenant_id, attempt) for tenant_id, attempt in rows]


def token_known(session: Session, job_id: str, token_hash: str) -> bool:
    """Whether some attempt of `job_id` holds the token of `token_hash` (platform-side: the API's
    edge asks before it reads a trainer's report; the report's own attempt is checked after)."""
    found = session.scalar(select(Attempt.pk).where(Attempt.job_id == job_id, Attempt.token_hash == token_hash)
                           .limit(1))
    return found is not None


def holding_token(session: Session, job_id: str, token_hash: str) -> tuple[Job, Attempt] | None:
    """The job `job_id` and its attempt holding the token of `token_hash`, if one does."""
    row = session.execute(select(Job, Attempt).join(Attempt, Attempt.job_id == Job.job_id)
                          .where(Job.job_id == job_id, Attempt.token_hash == token_hash).limit(1)).first()
    return (row[0], row[1]) if row is not None else None


def active_with_tenant(session: Session) -> list[tuple[str, Attempt]]:
    """(tenant_id, attempt) of every starting or running attempt (platform-side: the scheduler's)."""
    rows = session.execute(
        select(Job.tenant_id, Attempt).join(Job, Job.job_id == Attempt.job_id)
        .where(Attempt.status.in_([s.value for s in ATTEMPT_ACTIVE])).order_by(Attempt.pk))
    return [(tenant_id, attempt) for tenant_id, attempt in rows]
