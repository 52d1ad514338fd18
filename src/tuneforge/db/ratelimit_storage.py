"""The API's rate-limit counters in a SQL database: a `limits` storage for fixed windows.

Several API processes — the workers of one host, or replicas on one
PostgreSQL database — count a tenant's requests together through it,
without Redis. A row per limit key holds the hits of its current window and
when that window ends; the first hit after the end starts a new window, as
the memory and Redis storages of `limits` do.

- SQLite: a file of its own (HOME/ratelimit.db by default), WAL and
  synchronous=OFF (counters are worth nothing after a crash), so limiter
  writes never wait for the platform database's write lock. An increment is
  one upsert and one read inside BEGIN IMMEDIATE: no two processes read the
  same count.
- PostgreSQL: one `INSERT ... ON CONFLICT DO UPDATE ... RETURNING` in
  autocommit; the row lock orders concurrent increments of one key.

Rows of windows that have ended are deleted at most once a minute per
process, so the table holds about one row per active tenant and limit.
Windows follow the clocks of the API hosts (keep them in sync).

URIs (registered with `limits` when this module is imported):
`tuneforge+sqlite:////abs/path.db`, `tuneforge+postgresql://user:pass@host/db`
(psycopg 3) or `tuneforge+postgresql+psycopg://...`.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse

from limits.errors import ConfigurationError
from limits.storage import Storage
from sqlalchemy import BigInteger, Column, Engine, Float, Index, MetaData, String, Table, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

log = logging.getLogger("tuneforge.ratelimit")

SQLITE_SCHEME = "tuneforge+sqlite"
POSTGRES_SCHEMES = ("tuneforge+postgresql", "tuneforge+postgresql+psycopg")
# the keyword TUNEFORGE_RATE_LIMIT_STORAGE accepts for "the platform's own database" (api/ratelimits.py)
PLATFORM_DATABASE = "database"
CLEANUP_INTERVAL_S = 60.0
# A limiter write that waits longer than this for SQLite's lock gives up (the request is let through).
# Writes hold the lock for tens of microseconds; the API counts on its event loop, which must not
# wait long for a process that holds the lock and does not let go.
SQLITE_BUSY_TIMEOUT_S = 1.0

metadata = MetaData()
counters = Table(
    "rate_limit_counters", metadata,
    Column("limit_key", String(512), primary_key=True),
    Column("hits", BigInteger, nullable=False),
    Column("expires_at", Float, nullable=False),  # unix seconds: when the window ends
    Index("ix_rate_limit_counters_expires_at", "expires_at"),
)

# The SQL of the storage, in one place, with the sqlite3 driver's named parameters (`_postgres`
# rewrites them for psycopg). An expired row restarts at this hit; in SET, both columns read the
# row as it was before the update (SQLite and PostgreSQL alike).
_UPSERT = """
INSERT INTO rate_limit_counters (limit_key, hits, expires_at) VALUES (:key, :amount, :expires_at)
ON CONFLICT (limit_key) DO UPDATE SET
  hits = CASE WHEN rate_limit_counters.expires_at <= :now THEN excluded.hits
              ELSE rate_limit_counters.hits + excluded.hits END,
  expires_at = CASE WHEN rate_limit_counters.expires_at <= :now THEN excluded.expires_at
                    ELSE rate_limit_counters.expires_at END
"""
_WINDOW = "SELECT hits, expires_at FROM rate_limit_counters WHERE limit_key = :key"
_LIVE_WINDOW = _WINDOW + " AND expires_at > :now"
_DELETE_KEY = "DELETE FROM rate_limit_counters WHERE limit_key = :key"
_DELETE_EXPIRED = "DELETE FROM rate_limit_counters WHERE expires_at <= :now"
_DELETE_ALL = "DELETE FROM rate_limit_counters"
_INCR_POSTGRES = _UPSERT + "RETURNING hits, expires_at"


def _postgres(statement: str) -> str:
    return re.sub(r":(\w+)", r"%(\1)s", statement)


_POSTGRES_SQL = {statement: _postgres(statement)
                 for statement in (_INCR_POSTGRES, _LIVE_WINDOW, _DELETE_KEY, _DELETE_EXPIRED, _DELETE_ALL)}


def sqlalchemy_url(uri: str) -> str:
    """The SQLAlchemy URL of a `tuneforge+...` storage URI."""
    scheme, _, rest = uri.partition("://")
    if scheme == SQLITE_SCHEME:
        url = f"sqlite://{rest}"
        if make_url(url).database in (None, "", ":memory:"):  # every process would count on its own
            raise ConfigurationError(f"{uri!r}: the SQLite rate-limit storage needs a file, e.g. "
                                     f"{SQLITE_SCHEME}:////var/lib/tuneforge/ratelimit.db")
        return url
    if scheme in POSTGRES_SCHEMES:
        return f"postgresql+psycopg://{rest}"  # psycopg 3, the platform's driver (not psycopg2)
    raise ConfigurationError(f"{uri!r} is not a tuneforge SQL rate-limit storage URI")


def storage_uri_for_database(database_url: str) -> str:
    """The storage URI that keeps counters in the database at `database_url` (SQLAlchemy URL)."""
    scheme, _, rest = database_url.partition("://")
    if scheme.startswith("sqlite"):
        return f"{SQLITE_SCHEME}://{rest}"
    if scheme.startswith("postgresql"):
        return f"{POSTGRES_SCHEMES[0]}://{rest}"
    raise ConfigurationError(f"rate-limit counters can be kept in SQLite or PostgreSQL, not {scheme!r}")


def check_storage_uri(uri: str) -> None:
    """Raise ValueError unless `uri` names a storage the API can count requests in."""
    if uri == PLATFORM_DATABASE:
        return
    from limits.storage import SCHEMES  # every storage class limits knows, ours included

    scheme = urlparse(uri).scheme
    if scheme.startswith("async+"):
        raise ValueError(f"TUNEFORGE_RATE_LIMIT_STORAGE {uri!r}: the API counts requests in worker threads; "
                         f"use the storage without 'async+'")
    if scheme not in SCHEMES:
        known = ", ".join(sorted(s for s in SCHEMES if not s.startswith("async+")))
        raise ValueError(f"TUNEFORGE_RATE_LIMIT_STORAGE {uri!r}: unknown storage scheme {scheme!r}; use "
                         f"{PLATFORM_DATABASE!r} or one of {known}")
    if scheme.startswith("tuneforge+"):
        try:
            sqlalchemy_url(uri)
        except ConfigurationError as exc:
            raise ValueError(f"TUNEFORGE_RATE_LIMIT_STORAGE {exc}") from None


def _sqlite_engine(url: str) -> Engine:
    Path(make_url(url).database).parent.mkdir(parents=True, exist_ok=True)
    # AUTOCOMMIT: the driver opens no transaction of its own; increments open theirs with BEGIN IMMEDIATE
    engine = create_engine(url, isolation_level="AUTOCOMMIT", pool_size=8, max_overflow=32,
                           connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_S})

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_connection, _record) -> None:  # noqa: ANN001
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=OFF")
        cursor.close()

    return engine


class SqlStorage(Storage):
    """A `limits` storage for the fixed-window strategy, over SQLite or PostgreSQL."""

    STORAGE_SCHEME = [SQLITE_SCHEME, *POSTGRES_SCHEMES]

    def __init__(self, uri: str, wrap_exceptions: bool = False,
                 clock: Callable[[], float] | None = None, **options: float | str | bool) -> None:
        """`clock`: unix seconds now (tests pass a fake one); `options` go to SQLAlchemy's create_engine."""
        url = sqlalchemy_url(uri)
        self._sqlite = url.startswith("sqlite")
        self.local_file = self._sqlite  # no network: callers may count without leaving their thread
        if self._sqlite:
            self._engine = _sqlite_engine(url)
        else:
            # no pre-ping: a dead pooled connection fails one increment (the request is let through)
            # and is replaced, rather than costing every increment a round trip
            self._engine = create_engine(url, isolation_level="AUTOCOMMIT",
                                         **{"pool_size": 8, "max_overflow": 32, **options})
        self._clock = clock or time.time
        self._next_cleanup = 0.0
        self._cleanup_lock = threading.Lock()
        self._create_table()
        super().__init__(uri, wrap_exceptions=wrap_exceptions)

    def _create_table(self) -> None:
        try:
            metadata.create_all(self._engine, checkfirst=True)
        except SQLAlchemyError:
            # another process created it at the same moment (PostgreSQL's CREATE is not race-free)
            with self._engine.connect() as conn:
                if not self._engine.dialect.has_table(conn, counters.name):
                    raise

    @property
    def base_exceptions(self) -> type[Exception] | tuple[type[Exception], ...]:
        return (SQLAlchemyError, self._engine.dialect.loaded_dbapi.Error)

    # Statements go to the driver through a pooled connection (Engine.raw_connection): SQLAlchemy's
    # statement layer would cost several times what SQLite itself spends on every API request.
    @contextmanager
    def _cursor(self) -> Iterator:
        connection = self._engine.raw_connection()
        cursor = None
        try:
            cursor = connection.cursor()
            yield cursor
        except Exception as exc:
            if self._engine.dialect.is_disconnect(exc, connection.dbapi_connection, cursor):
                connection.invalidate(exc)  # the pool replaces it rather than hand it out again
            raise
        finally:
            if cursor is not None:
                cursor.close()
            connection.close()  # back to the pool

    def _sql(self, statement: str) -> str:
        return statement if self._sqlite else _POSTGRES_SQL[statement]

    def incr_with_expiry(self, key: str, expiry: int, amount: int = 1) -> tuple[int, float]:
        """Add `amount` hits to the window of `key` (a new window of `expiry` seconds if it has
        none or it has ended): the window's hits after this one, and when it ends."""
        now = self._clock()
        params = {"key": key, "amount": amount, "now": now, "expires_at": now + expiry}
        with self._cursor() as cursor:
            if self._sqlite:
                cursor.execute("BEGIN IMMEDIATE")
                try:
                    cursor.execute(_UPSERT, params)
                    cursor.execute(_WINDOW, params)
                    hits, expires_at = cursor.fetchone()
                    cursor.execute("COMMIT")
                except BaseException:
                    _rollback(cursor)
                    raise
            else:
                cursor.execute(_POSTGRES_SQL[_INCR_POSTGRES], params)
                hits, expires_at = cursor.fetchone()
        self._clean_now_and_then(now)
        return int(hits), float(expires_at)

    def incr(self, key: str, expiry: int, amount: int = 1) -> int:
        return self.incr_with_expiry(key, expiry, amount)[0]

    def _live_window(self, key: str, now: float) -> tuple[int, float] | None:
        with self._cursor() as cursor:
            cursor.execute(self._sql(_LIVE_WINDOW), {"key": key, "now": now})
            row = cursor.fetchone()
        return (int(row[0]), float(row[1])) if row else None

    def get(self, key: str) -> int:
        window = self._live_window(key, self._clock())
        return window[0] if window else 0

    def get_expiry(self, key: str) -> float:
        """When the window of `key` ends; now if it has none."""
        now = self._clock()
        window = self._live_window(key, now)
        return window[1] if window else now

    def check(self) -> bool:
        try:
            with self._cursor() as cursor:
                cursor.execute("SELECT 1")
            return True
        except self.base_exceptions:
            return False

    def reset(self) -> int | None:
        with self._cursor() as cursor:
            cursor.execute(self._sql(_DELETE_ALL))
            return cursor.rowcount

    def clear(self, key: str) -> None:
        with self._cursor() as cursor:
            cursor.execute(self._sql(_DELETE_KEY), {"key": key})

    def delete_expired(self, now: float | None = None) -> int:
        """Delete the rows of windows that have ended; how many there were."""
        with self._cursor() as cursor:
            cursor.execute(self._sql(_DELETE_EXPIRED), {"now": self._clock() if now is None else now})
            return cursor.rowcount

    def _clean_now_and_then(self, now: float) -> None:
        if now < self._next_cleanup or not self._cleanup_lock.acquire(blocking=False):
            return
        try:
            if now < self._next_cleanup:
                return
            self._next_cleanup = now + CLEANUP_INTERVAL_S
            self.delete_expired(now)
        except self.base_exceptions as exc:  # the next round tries again; this hit has been counted
            log.warning("could not delete expired rate-limit windows: %s", exc)
        finally:
            self._cleanup_lock.release()

    def close(self) -> None:
        self._engine.dispose()


def _rollback(cursor) -> None:  # noqa: ANN001 - a DBAPI cursor
    try:
        cursor.execute("ROLLBACK")
    except Exception:  # noqa: BLE001 - no transaction left to roll back (BEGIN itself failed)
        pass
