"""PostgreSQL session-level advisory locks (scheduler/leader.py: one scheduler at a time).

A lock taken with `try_take` lives exactly as long as the connection that took it; it names no
table and no tenant (platform-wide on purpose)."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Connection


def held(connection: Connection, key: int) -> bool:
    """Whether some session of this database holds the advisory lock `key` (a bigint) right now;
    takes nothing. The lock shows in pg_locks as its high and low 32 bits."""
    count = connection.execute(text(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
        "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
        "AND classid = :high AND objid = :low AND objsubid = 1"),
        {"high": key >> 32, "low": key & 0xFFFFFFFF}).scalar()
    return bool(count)


def try_take(connection: Connection, key: int) -> bool:
    """Take the advisory lock `key` for `connection`'s session without waiting; whether it holds it."""
    return bool(connection.execute(text("SELECT pg_try_advisory_lock(:key)"), {"key": key}).scalar())


def release(connection: Connection, key: int) -> None:
    connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": key})
