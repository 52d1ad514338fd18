"""What the scheduler reads of the cluster's jobs, attempts and checkpoints (services/training/cluster_state.py).

Every read here is platform-wide on purpose: the scheduler places every tenant's jobs on one
inventory, so it reads every tenant's rows, and each row it acts on names its job's tenant."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from tuneforge.db.tables import Attempt, Checkpoint, Job
from tuneforge.domain.status import JobStatus


def running_or_queued(session: Session, job_ids: list[str]) -> list[Job]:
    """The jobs of `job_ids` (those with an active attempt) and every queued job, of every tenant."""
    return list(session.scalars(select(Job).where(
        Job.job_id.in_(job_ids) | (Job.status == JobStatus.QUEUED.value))))


def newest_checkpoint_at(session: Session) -> dict[str, float]:
    """job_id -> when its newest checkpoint was written, of every job that has one."""
    return dict(session.execute(
        select(Checkpoint.job_id, func.max(Checkpoint.created_at)).group_by(Checkpoint.job_id)).all())


def last_attempt_end(session: Session, job_ids: list[str]) -> dict[str, float | None]:
    """job_id -> when its latest attempt ended, of those of `job_ids` that had an attempt."""
    return dict(session.execute(select(Attempt.job_id, func.max(Attempt.ended_at)).where(
        Attempt.job_id.in_(job_ids)).group_by(Attempt.job_id)).all())


def preempted_or_lost(session: Session, job_ids: list[str]) -> list[tuple]:
    """(job_id, placement, handle, failure_class, status) of the attempts of `job_ids` that were
    preempted or lost."""
    return list(session.execute(
        select(Attempt.job_id, Attempt.placement, Attempt.handle, Attempt.failure_class, Attempt.status).where(
            Attempt.job_id.in_(job_ids),
            (Attempt.failure_class == "preempted") | (Attempt.status == "lost"))).all())


def newest_checkpoint_step(session: Session, job_ids: list[str]) -> dict[str, int]:
    """job_id -> the step of its newest checkpoint, of those of `job_ids` that have one."""
    return dict(session.execute(select(Checkpoint.job_id, func.max(Checkpoint.step)).where(
        Checkpoint.job_id.in_(job_ids)).group_by(Checkpoint.job_id)).all())


def total_steps(session: Session, job_ids: list[str]) -> dict[str, int | None]:
    """job_id -> the most training steps an attempt of it reported, of those of `job_ids` with attempts."""
    return dict(session.execute(select(Attempt.job_id, func.max(Attempt.total_steps)).where(
        Attempt.job_id.in_(job_ids)).group_by(Attempt.job_id)).all())


def attempt_spans_since(session: Session, since: float) -> list[tuple]:
    """(tenant_id, gpus, started_at, ended_at) of every attempt still running or that ended after `since`."""
    return list(session.execute(
        select(Job.tenant_id, Attempt.gpus, Attempt.started_at, Attempt.ended_at)
        .join(Job, Job.job_id == Attempt.job_id)
        .where((Attempt.ended_at.is_(None)) | (Attempt.ended_at > since))).all())
