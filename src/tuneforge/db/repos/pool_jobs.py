"""The training API's pool jobs (services/training_api/scheduled.py): jobs of the platform's own
tenant, looked up platform-wide on purpose (no tenant owns them), and their attempts."""

from __future__ import annotations

import secrets
from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from tuneforge.db.tables import Attempt, Job, Tenant


def tenant_named(session: Session, name: str) -> Tenant | None:
    return session.scalar(select(Tenant).where(Tenant.name == name))


def by_id(session: Session, job_id: str) -> Job | None:
    return session.scalar(select(Job).where(Job.job_id == job_id))


def by_ids(session: Session, job_ids: Sequence[str]) -> list[Job]:
    return list(session.scalars(select(Job).where(Job.job_id.in_(list(job_ids)))))


def unfinished_of(session: Session, tenant_id: str, statuses: Sequence[str]) -> list[Job]:
    return list(session.scalars(select(Job).where(Job.tenant_id == tenant_id, Job.status.in_(list(statuses)))))


def newest_attempt(session: Session, job_id: str) -> Attempt | None:
    return session.scalar(select(Attempt).where(Attempt.job_id == job_id).order_by(Attempt.number.desc()).limit(1))


def current_attempt(session: Session, job_id: str, token_digest: str) -> Attempt | None:
    """The job's newest attempt while it starts or runs, when `token_digest` (sha256 hex of a job
    token) is that attempt's; None otherwise: an earlier attempt's token is no longer good."""
    attempt = newest_attempt(session, job_id)
    if attempt is None or attempt.status not in ("starting", "running") or \
            not secrets.compare_digest(attempt.token_hash, token_digest):
        return None
    return attempt
