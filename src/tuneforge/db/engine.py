"""Engine and sessions for SQLite (embedded) and PostgreSQL (cluster)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from tuneforge.db import notify

if TYPE_CHECKING:
    from tuneforge.db.listen import EventListener


def _sqlite_pragmas(dbapi_connection, _record) -> None:  # noqa: ANN001
    cursor = dbapi_connection.cursor()
    # WAL lets the API read while the scheduler writes; busy_timeout makes
    # concurrent writers wait instead of failing with "database is locked".
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def json_loads(text: str | bytes) -> Any:
    """JSON columns as Python values: orjson (several times faster than json on the job rows every
    job read decodes), falling back to json for what only json reads (NaN written by json.dumps)."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


def make_engine(url: str, pool_size: int = 10, max_overflow: int = 30) -> Engine:
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        # A connection per thread that may want one (the API's thread pool has 40), and SQLite
        # connections are cheap: waiting happens on SQLite's write lock, never for a connection.
        engine = create_engine(
            url, connect_args={"check_same_thread": False, "timeout": 30}, pool_size=48, max_overflow=16,
            json_deserializer=json_loads,
        )
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    # Per process: up to pool_size + max_overflow server connections. Mind PostgreSQL's
    # max_connections (default 100) when several API workers and replicas share one server.
    # psycopg decodes json columns itself, with json.loads unless told otherwise
    return create_engine(url, pool_size=pool_size, max_overflow=max_overflow, pool_pre_ping=True,
                         json_deserializer=json_loads)


def write_lock(session: Session) -> None:
    """On SQLite, take the database's write lock now (BEGIN IMMEDIATE, waiting out the busy
    timeout) unless this transaction already began: what the transaction reads from here on cannot
    change under it before it commits, so a check and the write it allows are one step. Python's
    sqlite3 driver would begin only at the first write, leaving every read before it outside
    the transaction. PostgreSQL locks the rows it must (`with_for_update`); nothing to do here."""
    if session.get_bind().dialect.name != "sqlite":
        return
    dbapi_connection = session.connection().connection.dbapi_connection
    if not dbapi_connection.in_transaction:
        session.connection().exec_driver_sql("BEGIN IMMEDIATE")


@contextmanager
def savepoint(session: Session) -> Iterator[None]:
    """`session.begin_nested()` that stays nested on SQLite too.

    Python's sqlite3 driver opens its transaction only at the first write, so a
    SAVEPOINT issued before any write starts SQLite's transaction itself, and
    releasing it commits everything: the enclosing unit of work would be
    committed half-way. Opening the transaction first (IMMEDIATE: a write is
    coming) keeps the savepoint inside it."""
    write_lock(session)
    with session.begin_nested():
        yield


class Database:
    """The engine plus a session factory; one per process."""

    def __init__(self, url: str, *, pool_size: int = 10, max_overflow: int = 30) -> None:
        self.url = url
        self.engine = make_engine(url, pool_size, max_overflow)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        # a commit that stored job events wakes their followers (and, on PostgreSQL, other processes')
        notify.install(self._sessions, self.engine.dialect.name)
        self._listener: EventListener | None = None
        self._listener_lock = threading.Lock()
        self.pool_size = pool_size
        self._reads: Any = None  # db.fastread.Reads, made on first use

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def new_session(self) -> Session:
        """A session that has not touched the database yet (no connection is taken until it is used)."""
        return self._sessions()

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A unit of work: commits on success, rolls back on error."""
        session = self._sessions()
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    def listen_for_events(self) -> EventListener | None:
        """Start (once) the LISTEN that wakes this process's event streams when another process
        commits job events; PostgreSQL only (None elsewhere: SQLite has no such thing)."""
        if self.dialect != "postgresql":
            return None
        with self._listener_lock:
            if self._listener is None:
                from tuneforge.db.listen import EventListener  # psycopg: PostgreSQL installs only

                self._listener = EventListener(self.url, notify.HUB)
                self._listener.start()
            return self._listener

    @property
    def reads(self) -> Any:
        """Where the API's lean reads run (`db.fastread.Reads`): made on first use, closed by `dispose`."""
        with self._listener_lock:
            if self._reads is None:
                from tuneforge.db.fastread import READ_CONNECTIONS, Reads  # it imports this module

                self._reads = Reads(self.engine, max(1, min(self.pool_size, READ_CONNECTIONS)))
            return self._reads

    def dispose(self) -> None:
        with self._listener_lock:
            reads, self._reads = self._reads, None
        if reads is not None:
            reads.close()
        with self._listener_lock:
            if self._listener is not None:
                self._listener.stop()
                self._listener = None
        self.engine.dispose()
