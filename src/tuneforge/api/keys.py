"""API keys as a request sees them: the process's key cache, and database look-ups run one at a
time per key.

Every request of a tenant used to look its key up in the database once the cache entry was a
second old: under load, all of that tenant's requests in flight missed together, each taking a
pool thread, a connection and (to record the key's last use) SQLite's write lock. Once a second
every other request waited behind them; that stall was the p99 of a neighbouring tenant under
a flood (docs/benchmarks-api.md, "A flood from one tenant"). Here a key has at most one
look-up running per event loop: requests that need it wait for that one, and a busy key is
re-read in the background before its entry expires (`KeyCache.refresh_after_s`), so its
requests rarely wait at all. What the cache promises is unchanged: no entry older than
`KeyCache.ttl_s` is trusted."""

from __future__ import annotations

import asyncio
import logging
from functools import partial

from sqlalchemy.exc import OperationalError
from starlette.concurrency import run_in_threadpool

from tuneforge.domain.errors import ApiError
from tuneforge.services.context import Platform

log = logging.getLogger(__name__)


def verify_columns(platform: Platform, authorization: str | None) -> tuple:
    """The key looked up in the database (and remembered): the cache's miss path; answers the
    tenant's columns. Marking the key used is best effort: a busy database never turns a valid
    key into an error."""
    db_session = platform.db.new_session()
    try:
        found = platform.keys.verify_columns(db_session, authorization)
        try:
            db_session.commit()
        except OperationalError as exc:
            log.warning("could not record an API key's last use: %s", exc)
            db_session.rollback()
        return found
    finally:
        db_session.close()


class KeyLookups:
    """The tenant columns of a request's key: from the cache, or from the one database look-up of
    that key in flight on this event loop."""

    def __init__(self, platform: Platform) -> None:
        self.platform = platform
        self._running: dict[str, asyncio.Task] = {}  # key hash -> its look-up

    async def columns(self, authorization: str | None) -> tuple:
        """Raises 401 for a missing, malformed, unknown, revoked or expired key."""
        key_hash, cached, due = self.platform.keys.peek(authorization)
        if cached is not None:
            if due:
                self._lookup(key_hash, authorization)  # this request goes on with the entry it has
            return cached
        # shielded: a client that goes away must not cancel the look-up other requests wait for
        return await asyncio.shield(self._lookup(key_hash, authorization))

    def _lookup(self, key_hash: str, authorization: str | None) -> asyncio.Task:
        loop = asyncio.get_running_loop()
        task = self._running.get(key_hash)
        # a task of another loop (a test client's loop that has ended) cannot be awaited here
        if task is not None and not task.done() and task.get_loop() is loop:
            return task
        task = loop.create_task(run_in_threadpool(verify_columns, self.platform, authorization))
        self._running[key_hash] = task
        task.add_done_callback(partial(self._done, key_hash))
        return task

    def _done(self, key_hash: str, task: asyncio.Task) -> None:
        if self._running.get(key_hash) is task:
            del self._running[key_hash]
        if task.cancelled():
            return
        failure = task.exception()  # retrieved here too: a background look-up has no one awaiting it
        if failure is not None and not isinstance(failure, ApiError):
            log.warning("looking up an API key failed: %r", failure)
