"""The statements of the lean reads (api/lean_reads.py: GET a job, a page of jobs, a page of a job's
events), compiled once per engine and run on a raw cursor (`db/fastread.py`).

Each statement binds `tenant_id`: a job is read together with its owner's id, and a job's events
only once the job was found to be the tenant's, so another tenant's job or events are simply not
found (`db/tenancy.py`, here in bound-parameter form)."""

from __future__ import annotations

from sqlalchemy import Engine, Text, bindparam, cast, select

from tuneforge.db.fastread import Cursor, NewestFirst, PlainRows, Prepared
from tuneforge.db.repos.events import NEWEST_EVENT
from tuneforge.db.tables import Job, JobEvent

JOB_ROWS = PlainRows(Job)


class JobReads:
    """`one.rows(cursor, tenant_id=, job_id=)`: the tenant's job as a `JOB_ROWS` row followed by the
    newest job event's key (the queue's version), in the same round trip; no row when the tenant
    has no such job. `pages.rows(cursor, after, limit, tenant_id=)`: the tenant's jobs, newest first
    (`NewestFirst`)."""

    def __init__(self, engine: Engine) -> None:
        newest_event = NEWEST_EVENT.scalar_subquery().label("newest_event")
        self.one = Prepared(engine, JOB_ROWS.select().add_columns(newest_event).where(
            Job.tenant_id == bindparam("tenant_id"), Job.job_id == bindparam("job_id")))
        self.pages = NewestFirst(engine, JOB_ROWS.select().where(Job.tenant_id == bindparam("tenant_id")),
                                 Job, Job.job_id)


class EventReads:
    """Pages of a job's events, newest first, each row (event_id, created_at, level, message, data
    as its JSON text, event_type); the job must be the tenant's."""

    def __init__(self, engine: Engine) -> None:
        self._job = Prepared(engine, select(Job.pk).where(Job.tenant_id == bindparam("tenant_id"),
                                                          Job.job_id == bindparam("job_id")))
        columns = (JobEvent.event_id, JobEvent.created_at, JobEvent.level, JobEvent.message,
                   cast(JobEvent.data, Text), JobEvent.event_type)  # JSON as its text, as in db/fastread.py
        self._pages = NewestFirst(engine, select(*columns).where(JobEvent.job_id == bindparam("job_id")),
                                  JobEvent, JobEvent.event_id)

    async def rows(self, raw: Cursor, tenant_id: str, job_id: str, after: str | None,
                   limit: int) -> list[tuple] | None:
        """Up to `limit` + 1 rows after the event `after` (see `NewestFirst`); None when the tenant
        has no such job."""
        if not await self._job.rows(raw, tenant_id=tenant_id, job_id=job_id):
            return None
        return await self._pages.rows(raw, after, limit, job_id=job_id)
