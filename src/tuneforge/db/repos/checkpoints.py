from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from tuneforge.db.pagination import Page, newest_first
from tuneforge.db.tables import Checkpoint


def page(session: Session, job_id: str, *, after: str | None, limit: int) -> Page:
    stmt = select(Checkpoint).where(Checkpoint.job_id == job_id)
    return newest_first(session, stmt, Checkpoint, Checkpoint.checkpoint_id, after, limit)


def at_step(session: Session, job_id: str, step: int) -> Checkpoint | None:
    return session.scalar(
        select(Checkpoint).where(Checkpoint.job_id == job_id, Checkpoint.step == step)
    )


def for_job(session: Session, job_id: str) -> list[Checkpoint]:
    return list(
        session.scalars(select(Checkpoint).where(Checkpoint.job_id == job_id).order_by(Checkpoint.step))
    )
