"""Wake-ups for whoever follows a job's events (the event streams).

A commit that stored events of a job wakes the waiters of that job in this
process (after the commit, never before: a waiter re-reads when woken, and
must find the event). On PostgreSQL the same commit also carries
`pg_notify(CHANNEL, job_id)`, issued inside the transaction, so PostgreSQL
delivers it to other processes' listeners (db/listen.py) only once the events
are visible, and drops it if the transaction rolls back.

Nothing here is needed for correctness: a follower that misses a wake-up still
finds the events at its next poll. Waiters are asyncio events; `notify` may be
called from any thread and wakes each waiter on its own loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import anyio
from sqlalchemy import event, text
from sqlalchemy.orm import Session, sessionmaker

CHANNEL = "tuneforge_job_events"
_ADDED = "tuneforge.job_events_added"  # session.info key: job ids with events added in this transaction
_log = logging.getLogger(__name__)


class Waiter:
    """One follower of one job: `wait` returns when the job had new events committed since the
    previous `wait` returned (or since the waiter was made), or after `timeout_s`."""

    def __init__(self, job_id: str, loop: asyncio.AbstractEventLoop) -> None:
        self.job_id = job_id
        self._loop = loop
        self._woken = asyncio.Event()

    def wake(self) -> None:
        """Thread-safe."""
        try:
            self._loop.call_soon_threadsafe(self._woken.set)
        except RuntimeError:  # the loop has closed: nobody waits any more
            pass

    @property
    def woken(self) -> bool:
        return self._woken.is_set()

    async def wait(self, timeout_s: float) -> bool:
        """True when woken, False when the time ran out."""
        with anyio.move_on_after(timeout_s):
            await self._woken.wait()
        woken = self._woken.is_set()
        # Cleared only here: a wake-up that comes while the follower reads counts for its next wait.
        self._woken.clear()
        return woken


class JobEventHub:
    """The waiters of this process, by job id."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: dict[str, set[Waiter]] = {}

    @contextmanager
    def waiter(self, job_id: str) -> Iterator[Waiter]:
        """A waiter for `job_id`, registered for the block; call from the event loop it waits on."""
        waiter = Waiter(job_id, asyncio.get_running_loop())
        with self._lock:
            self._waiters.setdefault(job_id, set()).add(waiter)
        try:
            yield waiter
        finally:
            with self._lock:
                waiters = self._waiters.get(job_id)
                if waiters is not None:
                    waiters.discard(waiter)
                    if not waiters:
                        del self._waiters[job_id]

    def notify(self, job_ids: Iterable[str]) -> None:
        with self._lock:
            waiters = [w for job_id in set(job_ids) for w in self._waiters.get(job_id, ())]
        for waiter in waiters:
            waiter.wake()

    def notify_all(self) -> None:
        """Every waiter re-reads (e.g. after notifications may have been lost)."""
        with self._lock:
            waiters = [w for group in self._waiters.values() for w in group]
        for waiter in waiters:
            waiter.wake()

    def waiting(self, job_id: str | None = None) -> int:
        with self._lock:
            if job_id is not None:
                return len(self._waiters.get(job_id, ()))
            return sum(len(group) for group in self._waiters.values())


# One per process: a commit on any thread, through any Database, wakes the streams of this process.
HUB = JobEventHub()


def event_added(session: Session, job_id: str) -> None:
    """Record that this transaction adds events of `job_id`: its commit wakes the job's followers."""
    session.info.setdefault(_ADDED, set()).add(job_id)


def install(sessions: sessionmaker, dialect: str) -> None:
    """Hook the notifications into every session `sessions` makes."""
    if dialect == "postgresql":
        event.listen(sessions, "before_commit", _send_notify)
    event.listen(sessions, "after_commit", _wake_local)
    event.listen(sessions, "after_rollback", _forget)


def _send_notify(session: Session) -> None:
    # Savepoints commit too; only the outermost commit publishes anything.
    if session.in_nested_transaction():
        return
    for job_id in sorted(session.info.get(_ADDED, ())):
        session.execute(text("SELECT pg_notify(:channel, :job_id)"), {"channel": CHANNEL, "job_id": job_id})


def _wake_local(session: Session) -> None:
    if session.in_nested_transaction():
        return
    job_ids = session.info.pop(_ADDED, None)
    if job_ids:
        HUB.notify(job_ids)


def _forget(session: Session) -> None:
    if not session.in_nested_transaction():
        session.info.pop(_ADDED, None)
