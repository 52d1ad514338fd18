from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from tuneforge.db.tables import Attempt
from tuneforge.domain.status import ATTEMPT_ACTIVE


def current(session: Session, job_id: str, number: int) -> Attempt | None:
    return session.scalar(
        select(Attempt).where(Attempt.job_id == job_id, Attempt.number == number)
    )


def active(session: Session) -> list[Attempt]:
    return list(
        session.scalars(
            select(Attempt)
            .where(Attempt.status.in_([s.value for s in ATTEMPT_ACTIVE]))
            .order_by(Attempt.pk)
        )
    )


def for_job(session: Session, job_id: str) -> list[Attempt]:
    return list(
        session.scalars(select(Attempt).where(Attempt.job_id == job_id).order_by(Attempt.number))
    )


def ended_since(session: Session, since: float) -> list[Attempt]:
    """Attempts that ended after `since` (epoch seconds), oldest first."""
    return list(session.scalars(
        select(Attempt).where(Attempt.ended_at.is_not(None), Attempt.ended_at > since).order_by(Attempt.pk)))
