"""The database's answer to a probe: no table is read (platform-wide on purpose, and of no tenant)."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Connection


def ping(connection: Connection) -> None:
    """One round trip on `connection`; raises when the database does not answer."""
    connection.execute(text("SELECT 1"))
