"""The `database_url` fixture: a database per test, on either backend (empty when the test is
marked `empty_database`; on PostgreSQL otherwise at the head revision).

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
from tuneforge.db.migrate import head_revision
from tuneforge.db.tables import Base

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


@pytest.mark.empty_database
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
def test_each_test_gets_its_own_postgres_database_at_head_with_nothing_left_by_others(
    database_url: str, run: str, held_connections: list[psycopg.Connection]
) -> None:
    name = make_url(database_url).database
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SELECT current_database()")).scalar_one() == name
            assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one() == head_revision()
            assert set(inspect(conn).get_table_names()) == set(Base.metadata.tables) | {"alembic_version"}
            for table in Base.metadata.tables:  # nothing left by the earlier runs
                assert conn.execute(text(f'SELECT count(*) FROM "{table}"')).scalar_one() == 0, table
        with engine.begin() as conn:  # left for the fixture to clear: rows, and a sequence moved on
            conn.execute(text("INSERT INTO tenants (tenant_id, name, tier, pii_policy, created_at) "
                              f"VALUES ('t-{run}', 'n-{run}', 'standard', 'warn', 0)"))
            pk = conn.execute(text("SELECT pk FROM tenants")).scalar_one()
            assert pk == 1, "the sequences start again for each test"
    finally:
        engine.dispose()
    # Still open at teardown: giving the database back must not wait for it.
    held_connections.append(psycopg.connect(libpq_url(database_url)))

    with psycopg.connect(libpq_url(os.environ[POSTGRES_URL_ENV])) as admin:
        existing = {row[0] for row in admin.execute("SELECT datname FROM pg_database")}
    assert name in existing
    assert name not in _seen_databases
    # an earlier test's database is dropped or renamed: nothing still connected to it reaches this one
    assert [old for old in _seen_databases if old in existing] == [], "an earlier test's database kept its name"
    _seen_databases.append(name)


@needs_postgres
def test_admin_url_converts_for_psycopg() -> None:
    admin_url = os.environ[POSTGRES_URL_ENV]
    assert libpq_url(admin_url).startswith("postgresql://")
    assert "+psycopg" not in libpq_url(admin_url)
