"""Fresh PostgreSQL databases for tests, made on the server scripts/pg.sh starts.

`database_url` (tests/conftest.py) takes an empty database from `lend` and gives it back with
`give_back`, which empties it again (every connection to it ended, its `public` schema dropped and
made anew) for the next test of the process: that costs a tenth of creating and dropping a
database, which each of the ~500 tests of the PostgreSQL stage would otherwise do. A database
that cannot be emptied is dropped; those left at exit are dropped too.
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


_lent_back: dict[str, list[str]] = {}  # admin URL -> emptied databases ready for the next test


def lend(admin_url: str) -> tuple[str, str]:
    """An empty database (one given back by an earlier test, or a new one): (name, URL)."""
    ready = _lent_back.get(admin_url)
    if ready:
        name = ready.pop()
        url = make_url(admin_url).set(drivername="postgresql+psycopg", database=name)
        return name, url.render_as_string(hide_password=False)
    return create_database(admin_url)


def give_back(admin_url: str, name: str) -> None:
    """Empty the database for the next test, under a new name (a connection the test leaked and
    that comes back finds no database of the old name); drop it if that cannot be done."""
    url = make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    new_name = f"tf_test_{uuid.uuid4().hex[:16]}"
    try:
        with psycopg.connect(libpq_url(admin_url), autocommit=True) as admin:
            _end_connections(admin, name)
            with psycopg.connect(libpq_url(url), autocommit=True) as conn:
                schemas = conn.execute("SELECT nspname FROM pg_namespace WHERE nspname !~ '^pg_' "
                                       "AND nspname <> 'information_schema'").fetchall()
                for (schema,) in schemas:
                    conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
                conn.execute("CREATE SCHEMA public")
            _end_connections(admin, name)
            admin.execute(sql.SQL("ALTER DATABASE {} RENAME TO {}").format(sql.Identifier(name),
                                                                            sql.Identifier(new_name)))
    except psycopg.Error:
        drop_database(admin_url, name)
        return
    if not _lent_back:
        atexit.register(_drop_all)
    _lent_back.setdefault(admin_url, []).append(new_name)


def _end_connections(admin: psycopg.Connection, name: str) -> None:
    admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s "
                  "AND pid <> pg_backend_pid()", (name,))


def _drop_all() -> None:
    for admin_url, names in _lent_back.items():
        for name in names:
            try:
                drop_database(admin_url, name)
            except psycopg.Error:
                pass  # the server may be gone already; scripts/pg.sh removes it with its data
    _lent_back.clear()
