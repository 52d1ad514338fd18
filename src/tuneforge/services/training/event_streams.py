"""Following a job's events as they happen (`GET .../events?stream=true`).

A request first finds where its stream starts (`start_point`, in the request's
unit of work: the job must be the tenant's, Last-Event-ID one of its events),
then takes a slot (`open_stream`: the tenant must have one free). What it gets
outlives the request and holds no session.

`follow` is async and never holds a thread while it waits: each look at the
database runs in a thread of the pool for the length of its query, in a short
session of its own, and between looks it awaits a wake-up (db/notify.py: a
commit of an event of this job, in this process or, on PostgreSQL, in any) or
the poll interval, whichever comes first.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import anyio
from sqlalchemy.orm import Session

from tuneforge.db.notify import HUB
from tuneforge.db.repos import events
from tuneforge.db.repos import jobs as job_repo
from tuneforge.db.tables import JobEvent
from tuneforge.domain.errors import invalid
from tuneforge.domain.status import TERMINAL, JobStatus
from tuneforge.services.context import Platform
from tuneforge.services.stream_slots import StreamSlot
from tuneforge.services.training.jobs import get_job

BATCH = 500  # events per look; a longer backlog is read in several


@dataclass(frozen=True)
class OpenStream:
    tenant_id: str
    job_id: str
    after_pk: int  # the stream starts after this event (0: from the first)
    slot: StreamSlot


def start_point(session: Session, tenant_id: str, job_id: str, last_event_id: str | None) -> int:
    """Where a stream of the job starts (`resume_after`): 404 for a job that is not the tenant's,
    400 for a Last-Event-ID that is not one of the job's events."""
    job = get_job(session, tenant_id, job_id)
    return resume_after(session, tenant_id, job.job_id, last_event_id)


def open_stream(platform: Platform, tenant_id: str, job_id: str, after_pk: int) -> OpenStream:
    """A stream slot for the tenant (429 when it holds as many as it may); no database work."""
    if platform.settings.stream_listen:
        platform.db.listen_for_events()
    return OpenStream(tenant_id, job_id, after_pk, platform.streams.acquire(tenant_id, job_id))


def resume_after(session: Session, tenant_id: str, job_id: str, last_event_id: str | None) -> int:
    """The pk after which a stream resumes: that of the event a reconnecting client saw last.
    An id the job does not have is refused rather than taken as "from the start": a client
    that sends one is confused, and replaying everything would hide it."""
    if last_event_id is None or not last_event_id.strip():
        return 0
    pk = events.pk_of(session, tenant_id, job_id, last_event_id.strip())
    if pk is None:
        raise invalid(f"Last-Event-ID {last_event_id.strip()!r} is not an event of job {job_id}; send the id of "
                      "the last event received from this job's stream, or no Last-Event-ID to start from the "
                      "first event", param="Last-Event-ID", code="invalid_last_event_id")
    return pk


async def follow(platform: Platform, stream: OpenStream) -> AsyncIterator[JobEvent]:
    """The job's events after `stream.after_pk`, oldest first, then new ones as they are committed;
    returns once the job has finished and every event is out, or when the server is closing
    (`platform.streams.closing`). Gives the slot back however it ends."""
    poll_s = platform.settings.stream_poll_s
    after_pk = stream.after_pk
    try:
        # registered before the first look, so that no commit falls between a look and the wait
        with HUB.waiter(stream.job_id) as waiter:
            while not platform.streams.closing:
                batch, finished = await anyio.to_thread.run_sync(_look, platform, stream, after_pk)
                for event in batch:
                    after_pk = event.pk
                    yield event
                if finished:
                    return
                if len(batch) < BATCH:
                    await waiter.wait(poll_s)
    finally:
        stream.slot.release()


def _look(platform: Platform, stream: OpenStream, after_pk: int) -> tuple[list[JobEvent], bool]:
    """(events after `after_pk`, whether they are the job's last). The status is read first:
    on PostgreSQL each statement sees what was committed when it started, so events read after
    a terminal status include every event committed with or before it."""
    with platform.db.session() as session:
        status = job_repo.status_of(session, stream.tenant_id, stream.job_id)
        batch = events.since(session, stream.tenant_id, stream.job_id, after_pk, limit=BATCH)
    finished = status is None or (JobStatus(status) in TERMINAL and len(batch) < BATCH)
    return batch, finished
