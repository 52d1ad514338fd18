"""GET /v1/fine_tuning/jobs/{id}, the route dashboards and CI pipelines poll hardest, read lean.

Each request reads the job's row from the database (one indexed SELECT on a pooled cursor,
`db/fastread.py`), so the answer is never older than the row. What is remembered, per process,
is the rendering: the encoded job object together with the exact row it was built from. When the
row read now equals that row, the encoded answer is reused; when anything in it changed (status,
error, metadata, the JSON of the request...), the job object is built again from the new row. A
queued job's place in the queue is computed from the queue as of the newest job event
(`services/queue.queue_as_of`), as before."""

from __future__ import annotations

import threading
from collections import OrderedDict

import orjson
from sqlalchemy import bindparam, select

from tuneforge.api.objects import job_object
from tuneforge.db.fastread import PlainRows, Prepared, cursor
from tuneforge.db.pagination import MAX_LIMIT
from tuneforge.db.tables import Job
from tuneforge.domain.status import JobStatus
from tuneforge.services import queue as queue_service
from tuneforge.services.context import Platform

JOB_ROWS = PlainRows(Job)
REMEMBERED = 2048  # rendered jobs kept per process (a couple of KB each)


class JobBodies:
    def __init__(self, platform: Platform, size: int = REMEMBERED) -> None:
        self.platform = platform
        engine = platform.db.engine
        # the row, and the newest job event's key (the queue's version) in the same round trip
        newest_event = queue_service.NEWEST_EVENT.scalar_subquery().label("newest_event")
        self._job = Prepared(engine, JOB_ROWS.select().add_columns(newest_event).where(
            Job.tenant_id == bindparam("tenant_id"), Job.job_id == bindparam("job_id")))
        self._status = JOB_ROWS.index("status")
        self._job_id = JOB_ROWS.index("job_id")
        # a page, newest first: the first `limit` + 1 of the tenant's jobs (one more tells has_more)
        owned = JOB_ROWS.select().where(Job.tenant_id == bindparam("tenant_id"))
        newest_first = (Job.pk.desc(),)
        self._first_page = Prepared(engine, owned.order_by(*newest_first).limit(bindparam("rows")))
        # after a cursor: jobs older than the job `after` (any tenant's id: the page stays the tenant's)
        cursor_pk = select(Job.pk).where(Job.job_id == bindparam("after")).scalar_subquery()
        self._cursor = Prepared(engine, select(Job.pk).where(Job.job_id == bindparam("after")))
        self._next_page = Prepared(engine, owned.where(Job.pk < cursor_pk).order_by(*newest_first)
                                   .limit(bindparam("rows")))
        self._size = size
        self._lock = threading.Lock()
        self._rendered: OrderedDict[str, tuple[tuple, bytes]] = OrderedDict()

    def read(self, tenant_id: str, job_id: str) -> bytes | None:
        """The job object as JSON, None when the tenant has no such job."""
        with cursor(self.platform.db.engine) as raw:
            rows = self._job.rows(raw, tenant_id=tenant_id, job_id=job_id)
        if not rows:
            return None
        *row, newest_event = rows[0]
        body = self._rendering(job_id, tuple(row))
        if row[self._status] != JobStatus.QUEUED.value:
            return body
        place = queue_service.place_in(queue_service.queue_as_of(self.platform, newest_event), job_id)
        return body[:-1] + b',"queue":' + orjson.dumps(place) + b"}"

    def page(self, tenant_id: str, after: str | None, limit: int) -> bytes:
        """A page of the tenant's jobs as JSON, in OpenAI's list shape, newest first, after the job
        `after` (an unknown `after`: an empty page)."""
        limit = max(1, min(int(limit), MAX_LIMIT))
        with cursor(self.platform.db.engine) as raw:
            if after is None:
                rows = self._first_page.rows(raw, tenant_id=tenant_id, rows=limit + 1)
            elif self._cursor.rows(raw, after=after):
                rows = self._next_page.rows(raw, tenant_id=tenant_id, after=after, rows=limit + 1)
            else:
                rows = []
        shown = [tuple(row) for row in rows[:limit]]
        bodies = [self._rendering(row[self._job_id], row) for row in shown]
        ends = (orjson.dumps(shown[0][self._job_id]), orjson.dumps(shown[-1][self._job_id])) if shown else (b"null",) * 2
        return b"".join((b'{"object":"list","data":[', b",".join(bodies), b'],"has_more":',
                         b"true" if len(rows) > limit else b"false",
                         b',"first_id":', ends[0], b',"last_id":', ends[1], b"}"))

    def _rendering(self, job_id: str, row: tuple) -> bytes:
        with self._lock:
            known = self._rendered.get(job_id)
            if known is not None and known[0] == row:
                self._rendered.move_to_end(job_id)
                return known[1]
        body = orjson.dumps(job_object(JOB_ROWS.to_object(row, self.platform.db.engine)))
        with self._lock:
            self._rendered[job_id] = (row, body)
            self._rendered.move_to_end(job_id)
            while len(self._rendered) > self._size:
                self._rendered.popitem(last=False)
        return body
