"""Reads on the API's hottest paths without the ORM: a SELECT compiled once for the engine's
dialect and run on a pooled DB-API cursor.

A job read through the ORM spends most of its CPU in SQLAlchemy (statement cache keys, result
processing, identity map, instance state), not in the database. The rows read here come back as
the driver gives them: JSON columns are selected as their stored text (`CAST(... AS TEXT)`), so
a row is a tuple of plain values that can be compared to the row a cached answer was built from,
and turned into a transient ORM object when it must be rendered again (`to_object`)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

from sqlalchemy import JSON, Boolean, Engine, Select, Text, bindparam, cast, inspect, select
from sqlalchemy.types import TypeDecorator

from tuneforge.db.engine import json_loads

Cursor = Any  # a DB-API cursor (sqlite3 or psycopg)
T = TypeVar("T")
# PostgreSQL reads in flight per API process (at most the pool's size): a read is one round trip of
# a fraction of a millisecond, and more threads than this only contend for the GIL (one pair of
# quick runs on 2 cores, 2 workers: 10 threads per worker cost 1.8 ms of API CPU per GET job, 4
# threads 0.8 ms; later runs with 4 threads measured 1.2-1.6 ms: the figures move from run to run)
READ_THREADS = 4


@contextmanager
def cursor(engine: Engine) -> Iterator[Cursor]:
    """A cursor on a pooled connection, returned to the pool (whose reset ends any read
    transaction the driver began) when done."""
    connection = engine.raw_connection()
    try:
        raw = connection.cursor()
        try:
            yield raw
        finally:
            raw.close()
    finally:
        connection.close()


class Prepared:
    """`stmt` compiled once for `engine`'s dialect; `rows(cursor, name=value, ...)` binds the
    statement's `bindparam`s by name (the parameters the dialect adds itself, such as SQLite's
    `OFFSET 0` after a LIMIT, keep their compiled values)."""

    def __init__(self, engine: Engine, stmt: Select) -> None:
        compiled = stmt.compile(dialect=engine.dialect)
        self.sql = compiled.string
        self._order = tuple(compiled.positiontup or ()) if compiled.positional else None
        self._defaults = {name: value for name, value in compiled.params.items() if value is not None}

    def rows(self, raw: Cursor, **params: Any) -> list[tuple]:
        if self._defaults:
            params = {**self._defaults, **params}
        bound = params if self._order is None else tuple(params[name] for name in self._order)
        raw.execute(self.sql, bound)
        return raw.fetchall()


def _is_json(column_type: Any) -> bool:
    return isinstance(column_type.impl if isinstance(column_type, TypeDecorator) else column_type, JSON)


class PlainRows:
    """Every mapped column of `model`, JSON ones as their text: `select()` starts a SELECT of them,
    `to_object(row)` rebuilds the transient object the ORM would have loaded from such a row."""

    def __init__(self, model: type) -> None:
        self.model = model
        attrs = inspect(model).column_attrs
        self._keys = [attr.key for attr in attrs]
        self._columns = [attr.columns[0] for attr in attrs]
        self._json = [_is_json(column.type) for column in self._columns]
        self._boolean = [isinstance(column.type, Boolean) for column in self._columns]

    def select(self) -> Select:
        return select(*(cast(column, Text).label(column.name) if is_json else column
                        for column, is_json in zip(self._columns, self._json)))

    def index(self, key: str) -> int:
        return self._keys.index(key)

    def to_object(self, row: tuple, engine: Engine) -> Any:
        values: dict[str, Any] = {}
        for key, column, is_json, boolean, value in zip(self._keys, self._columns, self._json, self._boolean, row):
            if value is not None and is_json:
                value = json_loads(value)
                if isinstance(column.type, TypeDecorator):
                    value = column.type.process_result_value(value, engine.dialect)
            elif value is not None and boolean:
                value = bool(value)
            values[key] = value
        return self.model(**values)


class NewestFirst:
    """Cursor pages of `stmt` (a SELECT on `model` with `bindparam`s of its own) in OpenAI's
    order, as `db.pagination.newest_first` reads them: newest first, after the row whose
    `id_column` is `after` (a row of any owner: the page keeps to `stmt`'s rows), an unknown
    `after` giving an empty page. `rows(...)` reads one more row than asked, which tells has_more."""

    def __init__(self, engine: Engine, stmt: Select, model: Any, id_column: Any) -> None:
        newest = model.pk.desc()
        cursor_pk = select(model.pk).where(id_column == bindparam("after"))
        self._first = Prepared(engine, stmt.order_by(newest).limit(bindparam("rows")))
        self._known = Prepared(engine, cursor_pk)
        self._next = Prepared(engine, stmt.where(model.pk < cursor_pk.scalar_subquery()).order_by(newest)
                              .limit(bindparam("rows")))

    def rows(self, raw: Cursor, after: str | None, limit: int, **params: Any) -> list[tuple]:
        if after is None:
            return self._first.rows(raw, rows=limit + 1, **params)
        if not self._known.rows(raw, after=after):
            return []
        return self._next.rows(raw, after=after, rows=limit + 1, **params)


class Reads:
    """Where the lean reads run: `await reads.call(fn, *args)` runs `fn(cursor, *args)`.

    SQLite: right here, on the event loop, with a pooled connection. Such a read never waits for
    a lock (WAL: readers do not wait for the writer) nor for a network, so it only costs its own
    CPU, which a trip to a thread would cost as well.

    PostgreSQL: on `threads` threads of their own, each keeping one connection in autocommit, so
    that a read is one round trip: no checkout from the pool with its ping, no rollback when the
    connection goes back (measured: through the shared pool and thread pool, GET job cost the API
    process 4.3 ms of CPU and the database a new connection whenever forty reads ran at once). A
    connection that failed is replaced, and the read tried once more on the new one."""

    def __init__(self, engine: Engine, threads: int) -> None:
        self.engine = engine
        self.sqlite = engine.dialect.name == "sqlite"
        self._threads = threads
        self._executor: ThreadPoolExecutor | None = None
        self._local = threading.local()
        self._opened: list[Any] = []
        self._lock = threading.Lock()
        self._conninfo = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        if self.sqlite:
            with cursor(self.engine) as raw:
                return fn(raw, *args)
        if self._executor is None:
            with self._lock:
                if self._executor is None:
                    self._executor = ThreadPoolExecutor(self._threads, thread_name_prefix="tuneforge-reads")
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._in_thread, fn, args)

    def _in_thread(self, fn: Callable[..., T], args: tuple) -> T:
        import psycopg  # a PostgreSQL platform has it; SQLite never gets here

        for attempt in (1, 2):
            connection = getattr(self._local, "connection", None)
            if connection is None or connection.closed:
                connection = psycopg.connect(self._conninfo, autocommit=True)
                self._local.connection = connection
                with self._lock:  # the ones closed after a failure are forgotten
                    self._opened = [kept for kept in self._opened if not kept.closed] + [connection]
            try:
                with connection.cursor() as raw:
                    return fn(raw, *args)
            except psycopg.OperationalError:
                connection.close()  # broken (the server restarted, the network dropped): a new one next
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        with self._lock:
            for connection in self._opened:
                connection.close()
            self._opened.clear()
