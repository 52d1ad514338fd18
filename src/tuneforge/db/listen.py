"""PostgreSQL LISTEN for job events other processes commit (the scheduler, other API workers).

One listener per Database (a process has one), started by the first event
stream: a connection of its own, outside the pool, in a daemon thread. Each
notification's payload is a job id (db/notify.py sends it with the commit that
stored the events) and wakes that job's waiters in this process.

A lost connection is reopened with a growing pause. Notifications sent while it
was away are gone, so every (re)connect wakes all waiters to re-read; the
streams' poll covers the time in between. If LISTEN never works (a pooler
that does not pass it on, missing rights), streams keep working on the poll
alone.
"""

from __future__ import annotations

import logging
import threading

import psycopg
from psycopg import sql
from sqlalchemy.engine import make_url

from tuneforge.db.notify import CHANNEL, JobEventHub

_log = logging.getLogger(__name__)
RECONNECT_MIN_S = 0.5
RECONNECT_MAX_S = 30.0
CHECK_STOP_S = 0.5  # how long one wait for notifications lasts before the thread looks whether to stop
APPLICATION_NAME = "tuneforge-event-listener"


def libpq_conninfo(sqlalchemy_url: str) -> str:
    """postgresql+psycopg://... -> postgresql://... (query options such as sslmode are kept)."""
    return make_url(sqlalchemy_url).set(drivername="postgresql").render_as_string(hide_password=False)


class EventListener:
    def __init__(self, url: str, hub: JobEventHub, *, channel: str = CHANNEL) -> None:
        self._conninfo = libpq_conninfo(url)
        self._hub = hub
        self._channel = channel
        self._stop = threading.Event()
        self._connected = threading.Event()
        self._thread: threading.Thread | None = None
        self.connects = 0  # successful LISTENs so far (a reconnect counts again)

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tuneforge-event-listener", daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float = 2 * CHECK_STOP_S) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)  # a daemon thread: one still blocked in connect ends with the process
            self._thread = None

    def _run(self) -> None:
        pause_s = RECONNECT_MIN_S
        outage_logged = False
        while not self._stop.is_set():
            try:
                with psycopg.connect(self._conninfo, autocommit=True, connect_timeout=10,
                                     application_name=APPLICATION_NAME) as conn:
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
                    self._connected.set()
                    self.connects += 1
                    pause_s, outage_logged = RECONNECT_MIN_S, False
                    self._hub.notify_all()
                    while not self._stop.is_set():
                        job_ids = [note.payload for note in conn.notifies(timeout=CHECK_STOP_S)]
                        if job_ids:
                            self._hub.notify(job_ids)
            except Exception as exc:  # noqa: BLE001 - whatever broke the connection, the poll covers until it is back
                if not self._stop.is_set():
                    log = _log.debug if outage_logged else _log.warning
                    log("listening for job events failed (%s); streams poll until it reconnects", exc)
                    outage_logged = True
            finally:
                self._connected.clear()
            self._stop.wait(pause_s)
            pause_s = min(2 * pause_s, RECONNECT_MAX_S)
