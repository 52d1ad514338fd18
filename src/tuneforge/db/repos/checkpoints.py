"""A job's checkpoints. Reads take the tenant and find nothing of another tenant's job
(`db/tenancy.owned_by_job`)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from tuneforge.db.pagination import Page, newest_first
from tuneforge.db.tables import Checkpoint
from tuneforge.db.tenancy import of_job, owned_by_job


def page(session: Session, tenant_id: str, job_id: str, *, after: str | None, limit: int) -> Page:
    stmt = owned_by_job(Checkpoint, tenant_id, job_id)
    return newest_first(session, stmt, Checkpoint, Checkpoint.checkpoint_id, after, limit)


def at_step(session: Session, tenant_id: str, job_id: str, step: int) -> Checkpoint | None:
    return session.scalar(owned_by_job(Checkpoint, tenant_id, job_id).where(Checkpoint.step == step))


def for_job(session: Session, tenant_id: str, job_id: str) -> list[Checkpoint]:
    return list(session.scalars(owned_by_job(Checkpoint, tenant_id, job_id).order_by(Checkpoint.step)))


def epoch_metrics(session: Session, tenant_id: str, job_id: str) -> list[tuple[float, dict[str, Any] | None]]:
    """(epoch, metrics) of the job's epoch-end checkpoints, by step: what a sweep judges trials on."""
    rows = session.execute(select(Checkpoint.epoch, Checkpoint.metrics).where(
        of_job(Checkpoint, tenant_id, job_id), Checkpoint.epoch.is_not(None)).order_by(Checkpoint.step))
    return [(epoch, metrics) for epoch, metrics in rows]
