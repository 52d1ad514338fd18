"""The queue as tenants, admins and the CLI see it: the scheduling order and estimated
starts, against the capacity this process knows (`Platform.capacity`) and the policy the
operator configured (`PolicyConfig.from_settings`)."""

from __future__ import annotations

import time

from sqlalchemy.orm import Session

from tuneforge.db.tables import Job
from tuneforge.scheduler.policy import PolicyConfig
from tuneforge.scheduler.queue_view import QueueEntry, queue_view
from tuneforge.services.context import Platform


def whole_queue(session: Session, platform: Platform, now: float | None = None) -> list[QueueEntry]:
    """Every queued job in the order it will start (jobs waiting out a retry backoff are left out)."""
    return queue_view(session, platform.capacity(), PolicyConfig.from_settings(platform.settings),
                      time.time() if now is None else now)


def place_of(session: Session, platform: Platform, job: Job) -> dict | None:
    """The job's position in the scheduling order and its estimated start (epoch seconds;
    None when it is larger than the inventory or the inventory is unknown). None when the
    job is not in the order (waiting out a retry backoff)."""
    for entry in whole_queue(session, platform):
        if entry.job_id == job.job_id:
            start = None if entry.estimated_start is None else int(entry.estimated_start)
            return {"position": entry.position, "estimated_start": start}
    return None
