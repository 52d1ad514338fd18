"""Alembic migrations, run programmatically (`tuneforge migrate`).

Several control planes may start at once against one database (replicas behind a load balancer,
a rolling restart): `upgrade` holds a migration lock — a PostgreSQL advisory lock, or an
exclusive `flock` beside a SQLite file — so one of them migrates while the others wait and
then find the schema at head. `tuneforge migrate` as a step before starting replicas does the
same under the same lock."""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
# "tunemigr": a positive bigint apart from the scheduler's lock
MIGRATION_LOCK_KEY = 0x74756E656D696772 & 0x7FFFFFFFFFFFFFFF


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    # '%' is an interpolation character in ConfigParser
    config.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return config


def _sqlite_path(database_url: str) -> Path | None:
    if database_url.startswith("sqlite") and "///" in database_url:
        path = database_url.split("///", 1)[1]
        if path and path != ":memory:":
            return Path(path)
    return None


@contextmanager
def migration_lock(database_url: str) -> Iterator[None]:
    """Held by one process at a time per database; blocks until it is free."""
    if make_url(database_url).get_backend_name() == "postgresql":
        engine = create_engine(database_url, poolclass=NullPool)
        try:
            with engine.connect() as conn:
                conn.execute(text("SELECT pg_advisory_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
                conn.commit()
                try:
                    yield
                finally:
                    conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": MIGRATION_LOCK_KEY})
                    conn.commit()
        finally:
            engine.dispose()
        return
    path = _sqlite_path(database_url)
    if path is None:
        yield
        return
    with open(path.parent / (path.name + ".migrate.lock"), "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def upgrade(database_url: str, revision: str = "head", *, replay: bool = False) -> None:
    """Bring the database to `revision`. To head: a database already there is left alone, and a
    fresh one (none of tuneforge's tables) gets the tables as `tables.py` defines them and is
    stamped at head, which ends where replaying every migration ends (tests/unit/db/test_migrations.py
    compares the two) in a fraction of the time. `replay`: run the migrations one by one anyway."""
    path = _sqlite_path(database_url)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)  # a fresh TUNEFORGE_HOME
    with migration_lock(database_url):
        if revision == "head" and not replay and _at_head_or_created(database_url):
            return
        command.upgrade(alembic_config(database_url), revision)


def _at_head_or_created(database_url: str) -> bool:
    """True when the database was at head already, or was fresh and now is (created from the
    table definitions, stamped at head, in one transaction); False: it needs its migrations."""
    from tuneforge.db.tables import Base

    engine = create_engine(database_url, poolclass=NullPool)
    try:
        with engine.begin() as conn:
            context = MigrationContext.configure(conn)
            current = context.get_current_revision()
            if current is not None:
                return current == head_revision()
            if set(inspect(conn).get_table_names()) & set(Base.metadata.tables):
                return False  # tables without a revision: let alembic say what is wrong
            Base.metadata.create_all(conn)
            context.stamp(_scripts(), "head")
            return True
    finally:
        engine.dispose()


def downgrade(database_url: str, revision: str) -> None:
    with migration_lock(database_url):
        command.downgrade(alembic_config(database_url), revision)


@lru_cache(maxsize=1)
def _scripts() -> ScriptDirectory:
    return ScriptDirectory.from_config(alembic_config("sqlite://"))


def head_revision() -> str | None:
    """The newest migration this code knows."""
    return _scripts().get_current_head()


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at (None: never migrated)."""
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()
