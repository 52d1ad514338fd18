"""Alembic environment: runs migrations against the URL set by tuneforge.db.migrate."""

from __future__ import annotations

from typing import Any

from alembic import context
from sqlalchemy import create_engine, pool

from tuneforge.db.tables import Base, TypedJSON

config = context.config
target_metadata = Base.metadata


def render_item(kind: str, value: Any, autogen_context: Any) -> str | bool:
    """Typed JSON columns are plain JSON to the database: a generated migration writes sa.JSON()."""
    if kind == "type" and isinstance(value, TypedJSON):
        return "sa.JSON()"
    return False


def run_migrations_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=True,
        render_item=render_item,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = create_engine(config.get_main_option("sqlalchemy.url"), poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(
            connection=connection, target_metadata=target_metadata, render_as_batch=True,
            render_item=render_item,
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
