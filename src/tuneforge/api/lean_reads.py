"""The reads dashboards and CI pipelines poll hardest, lean: GET a job, a page of jobs, a page of a
job's events.

Each request reads its rows from the database (indexed SELECTs, `db/repos/lean_reads.py`, on a
pooled cursor, `db/fastread.py`), so an answer is never older than its rows. For jobs, what is
remembered per process is the rendering: the encoded job object together with the exact row it
was built from.
When the row read now equals that row, the encoded object is reused; when anything in it changed
(status, error, metadata, the JSON of the request...), the job object is built again from the new
row. A queued job's place in the queue is computed from the queue as of the newest job event
(`services/queue.queue_as_of`). Events never change once written: theirs are encoded from the row
each time, which costs less than remembering them."""

from __future__ import annotations

import threading
from collections import OrderedDict
from functools import partial

import orjson

from tuneforge.api.objects import job_object
from tuneforge.db.engine import json_loads
from tuneforge.db.fastread import Reads
from tuneforge.db.pagination import MAX_LIMIT
from tuneforge.db.repos.lean_reads import JOB_ROWS, EventReads, JobReads
from tuneforge.domain.status import JobStatus
from tuneforge.services.context import Platform
from tuneforge.services.training import queue as queue_service


def list_body(items: list[bytes], ids: list[str], has_more: bool) -> bytes:
    """OpenAI's list object around already encoded items (`ids`: theirs, in order)."""
    first, last = (orjson.dumps(ids[0]), orjson.dumps(ids[-1])) if ids else (b"null", b"null")
    return b"".join((b'{"object":"list","data":[', b",".join(items), b'],"has_more":',
                     b"true" if has_more else b"false", b',"first_id":', first, b',"last_id":', last, b"}"))


REMEMBERED = 2048  # rendered jobs kept per process (a couple of KB each)


class JobBodies:
    def __init__(self, platform: Platform, size: int = REMEMBERED) -> None:
        self.platform = platform
        self.reads: Reads = platform.db.reads
        # the row, and the newest job event's key (the queue's version) in the same round trip
        reads = JobReads(platform.db.engine)
        self._job = reads.one
        self._status = JOB_ROWS.index("status")
        self._job_id = JOB_ROWS.index("job_id")
        self._pages = reads.pages
        self._size = size
        self._lock = threading.Lock()
        self._rendered: OrderedDict[str, tuple[tuple, bytes]] = OrderedDict()

    async def read(self, tenant_id: str, job_id: str) -> bytes | None:
        """The job object as JSON, None when the tenant has no such job."""
        rows = await self.reads.call(partial(self._job.rows, tenant_id=tenant_id, job_id=job_id))
        if not rows:
            return None
        *row, newest_event = rows[0]
        body = self._rendering(job_id, tuple(row))
        if row[self._status] != JobStatus.QUEUED.value:
            return body
        place = queue_service.place_in(queue_service.queue_as_of(self.platform, newest_event), job_id)
        return body[:-1] + b',"queue":' + orjson.dumps(place) + b"}"

    async def page(self, tenant_id: str, after: str | None, limit: int) -> bytes:
        """A page of the tenant's jobs as JSON, in OpenAI's list shape, newest first, after the job
        `after` (an unknown `after`: an empty page)."""
        limit = max(1, min(int(limit), MAX_LIMIT))
        rows = await self.reads.call(partial(self._pages.rows, after=after, limit=limit, tenant_id=tenant_id))
        shown = [tuple(row) for row in rows[:limit]]
        ids = [row[self._job_id] for row in shown]
        return list_body([self._rendering(job_id, row) for job_id, row in zip(ids, shown)], ids, len(rows) > limit)

    def _rendering(self, job_id: str, row: tuple) -> bytes:
        with self._lock:
            known = self._rendered.get(job_id)
            if known is not None and known[0] == row:
                self._rendered.move_to_end(job_id)
                return known[1]
        body = orjson.dumps(job_object(JOB_ROWS.to_object(row, self.platform.db.engine),
                                       self.platform.settings.openai_strict_status))
        with self._lock:
            self._rendered[job_id] = (row, body)
            self._rendered.move_to_end(job_id)
            while len(self._rendered) > self._size:
                self._rendered.popitem(last=False)
        return body


class EventPages:
    """Pages of a job's events (GET .../events, not streamed), as `api.objects.event_object` shows
    them; the job must be the tenant's."""

    def __init__(self, platform: Platform) -> None:
        self.platform = platform
        self.reads: Reads = platform.db.reads
        self._events = EventReads(platform.db.engine)

    async def page(self, tenant_id: str, job_id: str, after: str | None, limit: int) -> bytes | None:
        """The page as JSON; None when the tenant has no such job."""
        limit = max(1, min(int(limit), MAX_LIMIT))
        rows = await self.reads.call(self._events.rows, tenant_id, job_id, after, limit)
        if rows is None:
            return None
        shown = rows[:limit]
        items = [orjson.dumps({"id": event_id, "object": "fine_tuning.job.event", "created_at": created_at,
                               "level": level, "message": message,
                               "data": (json_loads(data) if data is not None else None) or {}, "type": event_type})
                 for event_id, created_at, level, message, data, event_type in shown]
        return list_body(items, [row[0] for row in shown], len(rows) > limit)
