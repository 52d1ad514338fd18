"""Fresh PostgreSQL databases for tests, made on the server scripts/pg.sh starts.

`database_url` (tests/conftest.py) takes a database from `lend` and gives it back with
`give_back`. A test gets a database at the head revision (what every control plane it starts
would make of an empty one), or, marked `empty_database` (the migrations' own tests), an empty
one. A database at head is given back emptied: every connection to it ended, every row
deleted, every sequence restarted, and renamed (a connection the test leaked that comes back
finds nothing of the old name); the next test of the process takes it. Creating a database and
its ~20 tables costs ~0.4 s quiet, several times that beside another stage, for each of the ~500
tests of the PostgreSQL stage; emptying one a few milliseconds. A database that cannot be
emptied so (its schema is not head's any more) is dropped, as is an empty one after its test,
and those left at exit.
"""

from __future__ import annotations

import atexit
import uuid

import psycopg
from psycopg import sql
from sqlalchemy.engine import make_url

# The admin URL of the test server (a SQLAlchemy URL); unset means "SQLite only".
POSTGRES_URL_ENV = "TUNEFORGE_TEST_POSTGRES_URL"


def libpq_url(sqlalchemy_url: str) -> str:
    """postgresql+psycopg://... -> postgresql://... for psycopg.connect."""
    return make_url(sqlalchemy_url).set(drivername="postgresql").render_as_string(hide_password=False)


def create_database(admin_url: str) -> tuple[str, str]:
    """Create an empty database; returns (name, SQLAlchemy URL of it)."""
    name = f"tf_test_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(libpq_url(admin_url), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    # Always the psycopg 3 driver: a bare postgresql:// would mean psycopg2 to SQLAlchemy.
    url = (
        make_url(admin_url)
        .set(drivername="postgresql+psycopg", database=name)
        .render_as_string(hide_password=False)
    )
    return name, url


def drop_database(admin_url: str, name: str) -> None:
    # FORCE: a test that leaked a connection or a pool must not block the drop.
    with psycopg.connect(libpq_url(admin_url), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


_ready: dict[str, list[str]] = {}  # admin URL -> emptied databases at head, for the next test


def lend(admin_url: str, *, at_head: bool) -> tuple[str, str]:
    """A database for one test: (name, URL). At head: an emptied one given back by an earlier
    test, or a new one brought to head; else a new, empty one."""
    ready = _ready.get(admin_url)
    if at_head and ready:
        name = ready.pop()
        url = make_url(admin_url).set(drivername="postgresql+psycopg", database=name)
        return name, url.render_as_string(hide_password=False)
    name, url = create_database(admin_url)
    if at_head:
        from tuneforge.db.migrate import upgrade

        upgrade(url)
    return name, url


def give_back(admin_url: str, name: str, *, at_head: bool) -> None:
    """Empty a database lent at head for the next test, under a new name; drop any other."""
    if at_head:
        new_name = f"tf_test_{uuid.uuid4().hex[:16]}"
        try:
            if _empty_at_head(admin_url, name, new_name):
                if not _ready:
                    atexit.register(_drop_all)
                _ready.setdefault(admin_url, []).append(new_name)
                return
        except psycopg.Error:
            pass
    drop_database(admin_url, name)


def _empty_at_head(admin_url: str, name: str, new_name: str) -> bool:
    from tuneforge.db.migrate import head_revision
    from tuneforge.db.tables import Base

    url = make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    with psycopg.connect(libpq_url(admin_url), autocommit=True) as admin:
        _end_connections(admin, name)
        with psycopg.connect(libpq_url(url), autocommit=True) as conn:
            tables = {row[0] for row in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
            schemas = {row[0] for row in conn.execute("SELECT nspname FROM pg_namespace WHERE nspname !~ '^pg_' "
                                                      "AND nspname <> 'information_schema'")}
            if tables != set(Base.metadata.tables) | {"alembic_version"} or schemas != {"public"}:
                return False
            if conn.execute("SELECT version_num FROM alembic_version").fetchall() != [(head_revision(),)]:
                return False
            with conn.transaction():
                conn.execute("SET LOCAL session_replication_role = replica")  # no FK order, no triggers
                for table in sorted(tables - {"alembic_version"}):
                    conn.execute(sql.SQL("DELETE FROM {}").format(sql.Identifier(table)))
                for (sequence,) in conn.execute("SELECT sequencename FROM pg_sequences "
                                                "WHERE schemaname = 'public'").fetchall():
                    conn.execute(sql.SQL("ALTER SEQUENCE {} RESTART").format(sql.Identifier(sequence)))
        _end_connections(admin, name)
        admin.execute(sql.SQL("ALTER DATABASE {} RENAME TO {}").format(sql.Identifier(name), sql.Identifier(new_name)))
    return True


def _end_connections(admin: psycopg.Connection, name: str) -> None:
    admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s "
                  "AND pid <> pg_backend_pid()", (name,))


def _drop_all() -> None:
    for admin_url, names in _ready.items():
        for name in names:
            try:
                drop_database(admin_url, name)
            except psycopg.Error:
                pass  # the server may be gone already; scripts/pg.sh removes it with its data
    _ready.clear()
