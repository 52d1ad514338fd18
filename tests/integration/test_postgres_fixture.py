"""The `database_url` fixture: an empty database per test, on either backend.

The PostgreSQL tests run in scripts/test.sh's second pass (TUNEFORGE_TEST_POSTGRES_URL
set) and skip otherwise.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.engine import make_url

from tests.helpers.postgres import POSTGRES_URL_ENV, libpq_url

needs_postgres = pytest.mark.skipif(
    not os.environ.get(POSTGRES_URL_ENV), reason=f"{POSTGRES_URL_ENV} not set (SQLite run)"
)

# Databases the earlier parametrised runs used, to check later runs against.
_seen_databases: list[str] = []


@pytest.fixture(scope="module")
def held_connections() -> Iterator[list[psycopg.Connection]]:
    """Connections kept open past their test, closed only when the module ends."""
    held: list[psycopg.Connection] = []
    yield held
    for conn in held:
        conn.close()


def test_backend_matches_the_url(database_url: str, db_backend: str) -> None:
    url = make_url(database_url)
    if db_backend == "postgresql":
        assert url.drivername == "postgresql+psycopg"
        assert url.database.startswith("tf_test_")
    else:
        assert url.drivername == "sqlite"
        assert url.database.endswith("tuneforge.db")


def test_database_is_empty_and_writable(database_url: str) -> None:
    engine = create_engine(database_url)
    try:
        assert inspect(engine).get_table_names() == []
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE probe (probe_id INTEGER PRIMARY KEY, label TEXT)"))
            conn.execute(text("INSERT INTO probe (probe_id, label) VALUES (1, 'a'), (2, 'b')"))
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM probe")).scalar_one() == 2
    finally:
        engine.dispose()


@needs_postgres
@pytest.mark.parametrize("run", ["first", "second", "third"])
def test_each_test_gets_its_own_postgres_database(
    database_url: str, run: str, held_connections: list[psycopg.Connection]
) -> None:
    name = make_url(database_url).database
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SELECT current_database()")).scalar_one() == name
            tables = conn.execute(
                text("SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'")
            ).all()
            assert tables == []  # nothing left by the earlier runs
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE leftover (leftover_id INTEGER PRIMARY KEY)"))
            conn.execute(text("INSERT INTO leftover VALUES (1)"))
    finally:
        engine.dispose()
    # Still open at teardown: the drop must not wait for it.
    held_connections.append(psycopg.connect(libpq_url(database_url)))

    with psycopg.connect(libpq_url(os.environ[POSTGRES_URL_ENV])) as admin:
        existing = {row[0] for row in admin.execute("SELECT datname FROM pg_database")}
    assert name in existing
    assert name not in _seen_databases
    assert [old for old in _seen_databases if old in existing] == [], "earlier test databases were not dropped"
    _seen_databases.append(name)


@needs_postgres
def test_admin_url_converts_for_psycopg() -> None:
    admin_url = os.environ[POSTGRES_URL_ENV]
    assert libpq_url(admin_url).startswith("postgresql://")
    assert "+psycopg" not in libpq_url(admin_url)
