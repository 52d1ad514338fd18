"""Fresh PostgreSQL databases for tests, made on the server scripts/pg.sh starts."""

from __future__ import annotations

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
