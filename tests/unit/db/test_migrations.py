from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from tuneforge.db.migrate import downgrade, upgrade
from tuneforge.db.tables import Base

TABLES = {"tenants", "api_keys", "base_models", "files", "jobs", "attempts", "job_events", "checkpoints",
          "fine_tuned_models", "model_stage_changes", "webhook_endpoints", "webhook_deliveries", "alembic_version"}


def test_upgrade_creates_every_table_and_downgrade_removes_them(database_url):
    upgrade(database_url)
    engine = create_engine(database_url)
    try:
        assert set(inspect(engine).get_table_names()) == TABLES
        downgrade(database_url, "base")
        assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
        upgrade(database_url)
        assert set(inspect(engine).get_table_names()) == TABLES
    finally:
        engine.dispose()


def test_migrations_match_the_table_definitions(database_url):
    upgrade(database_url)
    engine = create_engine(database_url)
    try:
        with engine.connect() as connection:
            diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
        assert diff == []
    finally:
        engine.dispose()
