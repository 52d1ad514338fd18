"""The job state machine: the only code that writes `jobs.status`.

Every change is checked against `domain.status.ALLOWED` and recorded as an
event, so the event log tells the whole life of a job.
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy.orm import Session

from tuneforge.db.repos import events
from tuneforge.db.tables import Job
from tuneforge.domain.status import TERMINAL, JobStatus, can_transition
from tuneforge.services.tenancy import audit
from tuneforge.services.webhooks import subscriptions as webhooks


class IllegalTransition(RuntimeError):
    pass


def transition(
    session: Session,
    job: Job,
    target: JobStatus,
    message: str,
    *,
    level: str = "info",
    data: dict[str, Any] | None = None,
    error: dict[str, Any] | None = None,
) -> None:
    current = JobStatus(job.status)
    if not can_transition(current, target):
        raise IllegalTransition(f"job {job.job_id}: {current.value} -> {target.value}")
    now = int(time.time())
    job.status = target.value
    if target == JobStatus.RUNNING and job.started_at is None:
        job.started_at = now
    if target in TERMINAL:
        job.finished_at = now
        job.estimated_finish = None
    if error is not None:
        job.error = error
    payload = {"status": target.value, **(data or {})}
    events.add(session, job, message, level=level, data=payload, attempt=job.attempt)
    audit.platform_change(session, f"job.{target.value}", "job", job.job_id, job.tenant_id,
                          {"from": current.value, "attempt": job.attempt})
    if target in TERMINAL:  # the outbox row commits (or rolls back) with the change itself
        webhooks.enqueue_job_event(session, job, target)


def is_terminal(job: Job) -> bool:
    return JobStatus(job.status) in TERMINAL
