"""The queue as tenants, admins and the CLI see it: the scheduling order and estimated
starts, against the capacity this process knows (`Platform.capacity`) and the policy the
operator configured (`PolicyConfig.from_settings`)."""

from __future__ import annotations

import time

from sqlalchemy.orm import Session

from tuneforge.db.repos import events as event_repo
from tuneforge.db.tables import Job
from tuneforge.planning.policy import PolicyConfig
from tuneforge.planning.pools import PoolSetup
from tuneforge.services.context import Platform
from tuneforge.services.training.queue_view import QueueEntry, queue_view


def whole_queue(session: Session, platform: Platform, now: float | None = None) -> list[QueueEntry]:
    """Every queued job in the order it will start (jobs waiting out a retry backoff are left out)."""
    return queue_view(session, platform.capacity(), PolicyConfig.from_settings(platform.settings),
                      time.time() if now is None else now, PoolSetup.from_settings(platform.settings))


# How long a computed queue may answer `place_of` while no job has changed state.
QUEUE_MEMO_S = 1.0


def queue_as_of(platform: Platform, newest_event: int | None, session: Session | None = None) -> list[QueueEntry]:
    """`whole_queue`, computed at most once a second per process while nothing changes: every
    state change of every job writes an event, so the newest event's key (`db/repos/events.NEWEST_EVENT`,
    read by the caller) tells whether the queue may have changed since it was computed. A busy dashboard
    polling queued jobs then costs one indexed lookup per request instead of a simulation of the
    whole queue. Computed in `session`, else in a unit of work of its own.

    One caller at a time computes it. When only its age is past (no job changed), the others answer
    from the queue computed last while one refreshes it; when a job changed, they wait for the
    new one (a second after a change, forty requests in threads would otherwise all compute it)."""
    memo = platform.queue
    if memo.entries is not None and memo.newest_event == newest_event:
        if 0 <= time.time() - memo.computed_at < QUEUE_MEMO_S:
            return memo.entries
        if not memo.lock.acquire(blocking=False):
            return memo.entries
    else:
        memo.lock.acquire()
    try:
        now = time.time()
        fresh = memo.newest_event == newest_event and 0 <= now - memo.computed_at < QUEUE_MEMO_S
        if memo.entries is not None and fresh:  # computed by the caller waited for
            return memo.entries
        if session is None:
            with platform.db.session() as own:
                entries = whole_queue(own, platform, now)
        else:
            entries = whole_queue(session, platform, now)
        memo.newest_event, memo.computed_at, memo.entries = newest_event, now, entries
        return entries
    finally:
        memo.lock.release()


def place_in(entries: list[QueueEntry], job_id: str) -> dict | None:
    """The job's position in the scheduling order and its estimated start (epoch seconds;
    None when it is larger than the inventory or the inventory is unknown). None when the
    job is not in the order (waiting out a retry backoff)."""
    for entry in entries:
        if entry.job_id == job_id:
            start = None if entry.estimated_start is None else int(entry.estimated_start)
            return {"position": entry.position, "estimated_start": start}
    return None


def place_of(session: Session, platform: Platform, job: Job) -> dict | None:
    """`place_in` the queue as `session` sees it now."""
    return place_in(queue_as_of(platform, event_repo.newest_pk(session), session), job.job_id)
