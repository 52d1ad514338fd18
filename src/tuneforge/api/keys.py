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
import time
from functools import partial

from sqlalchemy.exc import OperationalError
from starlette.concurrency import run_in_threadpool

from tuneforge.db.repos import attempts as attempt_repo
from tuneforge.domain.errors import ApiError, unauthorized
from tuneforge.services.context import Platform
from tuneforge.services.training.reports import token_hash

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


class TrainerTokens:
    """Job tokens known to belong to an attempt of their job, so that a trainer's report is read
    only once its sender is known (api/guard.py asks before the body). Which attempt a report
    speaks for is in its body: the route checks that one after (services/reports.authorize).

    A token found valid is remembered for `ttl_s`, at most `max_entries` of them (then all are
    forgotten at once), so a busy trainer's heartbeats cost one look-up a minute here."""

    ttl_s = 60.0
    max_entries = 4096

    def __init__(self, platform: Platform) -> None:
        self.platform = platform
        self._known_until: dict[tuple[str, str], float] = {}  # (job id, token hash) -> monotonic deadline

    async def check(self, job_id: str, authorization: str | None) -> None:
        """Raises the 401 the report route would answer for a token that no attempt of `job_id` holds."""
        token = (authorization or "").partition(" ")[2].strip()
        if not token:
            raise _invalid_job_token()
        key = (job_id, token_hash(token))
        now = time.monotonic()
        if self._known_until.get(key, 0.0) > now:
            return
        if not await run_in_threadpool(self._known, *key):
            raise _invalid_job_token()
        if len(self._known_until) >= self.max_entries:
            self._known_until.clear()
        self._known_until[key] = now + self.ttl_s

    def _known(self, job_id: str, hashed: str) -> bool:
        with self.platform.db.session() as db_session:
            return attempt_repo.token_known(db_session, job_id, hashed)


def _invalid_job_token() -> ApiError:
    return unauthorized("invalid job token", code="invalid_job_token")
