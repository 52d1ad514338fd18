"""Reads on the API's hottest paths without the ORM: a SELECT compiled once for the engine's
dialect and awaited on a connection of their own (`Reads`).

A job read through the ORM spends most of its CPU in SQLAlchemy (statement cache keys, result
processing, identity map, instance state), not in the database. The rows read here come back as
the driver gives them: JSON columns are selected as their stored text (`CAST(... AS TEXT)`), so
a row is a tuple of plain values that can be compared to the row a cached answer was built from,
and turned into a transient ORM object when it must be rendered again (`to_object`)."""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from sqlalchemy import JSON, Boolean, Engine, Select, Text, bindparam, cast, inspect, select
from sqlalchemy.types import TypeDecorator

from tuneforge.db.engine import json_loads

Cursor = Any  # psycopg's AsyncCursor, or a sqlite3 cursor behind `SyncCursor`
T = TypeVar("T")
# PostgreSQL connections of the lean reads per API process (at most the pool's size): a read is one
# round trip of a fraction of a millisecond, so a few connections keep the server busy
READ_CONNECTIONS = 4


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

    async def rows(self, raw: Cursor, **params: Any) -> list[tuple]:
        if self._defaults:
            params = {**self._defaults, **params}
        bound = params if self._order is None else tuple(params[name] for name in self._order)
        await raw.execute(self.sql, bound)
        return await raw.fetchall()


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

    async def rows(self, raw: Cursor, after: str | None, limit: int, **params: Any) -> list[tuple]:
        if after is None:
            return await self._first.rows(raw, rows=limit + 1, **params)
        if not await self._known.rows(raw, after=after):
            return []
        return await self._next.rows(raw, after=after, rows=limit + 1, **params)


class SyncCursor:
    """A sqlite3 cursor behind the awaitable face of psycopg's `AsyncCursor` (`execute`,
    `fetchall`), so that one read function serves both databases."""

    __slots__ = ("raw",)

    def __init__(self, raw: Cursor) -> None:
        self.raw = raw

    async def execute(self, sql: str, params: Any) -> None:
        self.raw.execute(sql, params)

    async def fetchall(self) -> list[tuple]:
        return self.raw.fetchall()


class _Slot:
    """One of the PostgreSQL connections of `Reads`, with the cursor reused by every read on it."""

    __slots__ = ("connection", "cursor")

    def __init__(self) -> None:
        self.connection: Any = None
        self.cursor: Any = None

    def drop(self) -> None:
        """Close the connection at once, from any thread and without awaiting (libpq's finish):
        the next read on this slot opens a new one."""
        if self.connection is not None and not self.connection.closed:
            self.connection.pgconn.finish()
        self.connection = self.cursor = None


class Reads:
    """Where the lean reads run: `await reads.call(fn, *args)` awaits `fn(cursor, *args)`, a
    coroutine function whose cursor has `await cursor.execute(sql, params)` and
    `await cursor.fetchall()`.

    SQLite: right here, on the event loop, with a pooled connection (behind `SyncCursor`). Such a
    read never waits for a lock (WAL: readers do not wait for the writer) nor for a network, so it
    only costs its own CPU, which a trip to a thread would cost as well.

    PostgreSQL: on the event loop too, on `connections` asynchronous psycopg connections of their
    own in autocommit, so that a read is one round trip: no checkout from the shared pool with its
    ping, no rollback when the connection goes back, no trip through a thread (measured: through
    the shared pool and thread pool, GET job cost the API process 4.3 ms of CPU; through threads
    with connections of their own ~0.18 ms per read in-process, on the loop ~0.12 ms, statements
    prepared by psycopg after their fifth use). A read waits its turn when all are busy. A
    connection that failed is replaced and the read tried once more on the new one; a read that
    ends any other way than with its rows (cancelled because the client left, or a statement
    error) closes its connection, whose state is then unknown.

    The connections belong to no event loop: one read at a time each, so one `Reads` serves
    event loops that follow each other (tests) or run side by side (a waiter is woken on its
    own loop)."""

    def __init__(self, engine: Engine, connections: int) -> None:
        self.engine = engine
        self.sqlite = engine.dialect.name == "sqlite"
        self._slots = [_Slot() for _ in range(connections)]
        self._idle = list(self._slots)
        self._waiters: deque[asyncio.Future] = deque()
        self._lock = threading.Lock()
        self._conninfo = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)

    async def call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        if self.sqlite:
            with cursor(self.engine) as raw:
                return await fn(SyncCursor(raw), *args)
        slot = await self._take()
        try:
            return await self._read(slot, fn, args)
        finally:
            self._give(slot)

    async def _read(self, slot: _Slot, fn: Callable[..., Awaitable[T]], args: tuple) -> T:
        import psycopg  # a PostgreSQL platform has it; SQLite never gets here

        for attempt in (1, 2):
            if slot.connection is None or slot.connection.closed:
                slot.connection = await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True)
                slot.cursor = slot.connection.cursor()
            try:
                return await fn(slot.cursor, *args)
            except psycopg.OperationalError:
                slot.drop()  # broken (the server restarted, the network dropped): a new one next
                if attempt == 2:
                    raise
            except BaseException:
                slot.drop()
                raise
        raise AssertionError("unreachable")

    async def _take(self) -> _Slot:
        with self._lock:
            if self._idle:
                return self._idle.pop()
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # handed over just as the wait was cancelled
                self._give(waiter.result())
            raise

    def _give(self, slot: _Slot) -> None:
        """The slot back: to the longest waiter still waiting (on its own loop), else idle."""
        while True:
            with self._lock:
                while self._waiters and self._waiters[0].done():
                    self._waiters.popleft()  # cancelled
                if not self._waiters:
                    self._idle.append(slot)
                    return
                waiter = self._waiters.popleft()
            loop = waiter.get_loop()
            try:
                here = asyncio.get_running_loop()
            except RuntimeError:
                here = None
            if loop is here:
                self._hand(waiter, slot)
                return
            try:
                loop.call_soon_threadsafe(self._hand, waiter, slot)
                return
            except RuntimeError:  # that loop is closed: its waiter is gone, try the next one
                continue

    def _hand(self, waiter: asyncio.Future, slot: _Slot) -> None:
        if waiter.done():
            self._give(slot)
        else:
            waiter.set_result(slot)

    def close(self) -> None:
        with self._lock:
            for slot in self._slots:
                slot.drop()

    @property
    def open_connections(self) -> int:
        return sum(1 for slot in self._slots if slot.connection is not None and not slot.connection.closed)
