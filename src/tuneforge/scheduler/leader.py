"""One scheduler at a time: leader election among control planes sharing a database.

PostgreSQL: a session-level advisory lock (`pg_try_advisory_lock`) held on a
dedicated connection. The lock lives exactly as long as that connection, so
a leader that dies (process killed, host gone) releases it when the server
notices the closed connection, and a standby's next try takes it over — within
one scheduler tick plus the TCP teardown. Each tick the leader checks its
connection is alive; if not, it stops scheduling until it holds the lock
again.

SQLite (one host): an exclusive `flock` on a file beside the database; the
kernel drops it when the process dies.
"""

from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path
from typing import IO

from sqlalchemy import create_engine
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.pool import NullPool

from tuneforge.db.repos import advisory_lock
from tuneforge.db.repos.health import ping

log = logging.getLogger(__name__)

LOCK_KEY = 0x74756E65666F7267 & 0x7FFFFFFFFFFFFFFF  # "tuneforg", a positive bigint


def leader_known(database_url: str, home: Path) -> bool:
    """Does some control plane hold the scheduler's lock right now? (a look that takes nothing:
    for /readyz of API processes that do not schedule themselves)"""
    url = make_url(database_url)
    if url.get_backend_name() == "postgresql":
        engine = create_engine(url, poolclass=NullPool)
        try:
            with engine.connect() as conn:
                return advisory_lock.held(conn, LOCK_KEY)
        finally:
            engine.dispose()
    path = _lock_path(url, home)
    if not path.exists():
        return False
    with open(path, "rb") as handle:
        try:
            # a shared lock is refused while the leader holds its exclusive one
            fcntl.flock(handle.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return True
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
        return False


def _lock_path(url, home: Path) -> Path:  # noqa: ANN001 - a sqlalchemy URL
    database = url.database or ""
    return Path(database + ".scheduler.lock") if database and database != ":memory:" else home / "scheduler.lock"


class LeaderLock:
    """`holds()` tries to be (or stay) the leader without blocking; True while it is."""

    def __init__(self, database_url: str, home: Path) -> None:
        self._url = make_url(database_url)
        self._postgres = self._url.get_backend_name() == "postgresql"
        self._conn: Connection | None = None
        self._engine = create_engine(self._url, poolclass=NullPool) if self._postgres else None
        self._lock_path = _lock_path(self._url, home)
        self._file: IO[bytes] | None = None
        self.is_leader = False

    def holds(self) -> bool:
        was = self.is_leader
        try:
            self.is_leader = self._try_postgres() if self._postgres else self._try_file()
        except Exception as exc:  # noqa: BLE001 - a lost connection means: not the leader now
            log.warning("leader lock check failed: %s", exc)
            self._drop_connection()
            self.is_leader = False
        if self.is_leader != was:
            log.info("this control plane %s the scheduler", "now runs" if self.is_leader else "no longer runs")
        return self.is_leader

    def _try_postgres(self) -> bool:
        if self._conn is not None and self.is_leader:
            ping(self._conn)  # still connected, so still holding the lock
            return True
        if self._conn is None:
            self._conn = self._engine.connect()
            self._conn.execution_options(isolation_level="AUTOCOMMIT")
        got = advisory_lock.try_take(self._conn, LOCK_KEY)
        self._conn.commit()
        return got

    def _try_file(self) -> bool:
        if self._file is not None:
            return True
        self._lock_path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self._lock_path, "a+b")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            return False
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()).encode())
        handle.flush()
        self._file = handle
        return True

    def _drop_connection(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:  # noqa: BLE001
                pass
            self._conn = None

    def release(self) -> None:
        if self._postgres:
            if self._conn is not None and self.is_leader:
                try:
                    advisory_lock.release(self._conn, LOCK_KEY)
                except Exception:  # noqa: BLE001
                    pass
            self._drop_connection()
            if self._engine is not None:
                self._engine.dispose()
        elif self._file is not None:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
            self._file.close()
            self._file = None
        self.is_leader = False
