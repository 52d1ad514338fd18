from __future__ import annotations

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect
from sqlalchemy.orm import Session

from tuneforge.db.migrate import current_revision, downgrade, head_revision, upgrade
from tuneforge.db.repos import tenants as tenant_repo
from tuneforge.db.tables import ApiKey, Base, Job

TABLES = {"tenants", "api_keys", "base_models", "files", "jobs", "attempts", "job_events", "checkpoints",
          "fine_tuned_models", "model_stage_changes", "webhook_endpoints", "webhook_deliveries", "tenant_secrets",
          "uploads", "upload_parts", "routes", "route_requests", "sweeps", "sweep_trials", "metered_tokens",
          "tenant_data_keys", "audit_log", "alembic_version"}


pytestmark = pytest.mark.empty_database  # the migrations run from nothing


def test_upgrade_creates_every_table_and_downgrade_removes_them(database_url):
    upgrade(database_url, replay=True)
    engine = create_engine(database_url)
    try:
        assert set(inspect(engine).get_table_names()) == TABLES
        downgrade(database_url, "base")
        assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
        upgrade(database_url, replay=True)
        assert set(inspect(engine).get_table_names()) == TABLES
    finally:
        engine.dispose()


def test_migrations_match_the_table_definitions(database_url):
    upgrade(database_url, replay=True)
    engine = create_engine(database_url)
    try:
        with engine.connect() as connection:
            diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
        assert diff == []
    finally:
        engine.dispose()


def _schema(url: str) -> dict:
    """Everything the database says about each table, in a comparable form."""
    engine = create_engine(url)
    try:
        found = inspect(engine)
        schema = {}
        for table in sorted(found.get_table_names()):
            schema[table] = {
                "columns": sorted((c["name"], str(c["type"]), c["nullable"], str(c.get("default")))
                            for c in found.get_columns(table)),
                "primary_key": found.get_pk_constraint(table)["constrained_columns"],
                "indexes": sorted((str(i["name"]), tuple(i["column_names"]), bool(i["unique"]))
                                  for i in found.get_indexes(table)),
                "unique": sorted((str(u["name"]), tuple(u["column_names"]))
                                 for u in found.get_unique_constraints(table)),
                "foreign_keys": sorted((tuple(f["constrained_columns"]), f["referred_table"],
                                        tuple(f["referred_columns"]), str(f.get("options", {}).get("ondelete")))
                                       for f in found.get_foreign_keys(table)),
                "checks": sorted(str(c["sqltext"]) for c in found.get_check_constraints(table)),
            }
        return schema
    finally:
        engine.dispose()


def test_a_fresh_database_is_created_as_the_migrations_would_build_it(database_url, tmp_path):
    """A fresh database gets its tables from the table definitions and a stamp at head, at once:
    the same schema, column by column, index by index, as replaying every migration; and a second
    upgrade leaves it alone."""
    from tests.helpers import postgres as pg

    upgrade(database_url)
    if database_url.startswith("sqlite"):
        replayed_url = f"sqlite:///{tmp_path}/replayed.db"
        upgrade(replayed_url, replay=True)
        cleanup = None
    else:
        import os
        admin = os.environ[pg.POSTGRES_URL_ENV]
        name, replayed_url = pg.create_database(admin)
        upgrade(replayed_url, replay=True)
        cleanup = (admin, name)
    try:
        created, replayed = _schema(database_url), _schema(replayed_url)
        assert set(created) == TABLES
        assert created == replayed
        engine = create_engine(database_url)
        try:
            assert current_revision(engine) == head_revision()
        finally:
            engine.dispose()
        upgrade(database_url)
        assert _schema(database_url) == created
    finally:
        if cleanup:
            pg.drop_database(*cleanup)


def test_rows_resolved_before_0007_get_the_method_and_training_type_of_their_request(database_url):
    upgrade(database_url, "0006")
    engine = create_engine(database_url)
    tenants = sa.table("tenants", *(sa.column(name, kind) for name, kind in (
        ("tenant_id", sa.String), ("name", sa.String), ("tier", sa.String), ("created_at", sa.BigInteger))))
    jobs_0006 = sa.table("jobs", *(sa.column(name, kind) for name, kind in (
        ("job_id", sa.String), ("tenant_id", sa.String), ("model", sa.String), ("base_model_sha256", sa.String),
        ("training_file", sa.String), ("status", sa.String), ("attempt", sa.Integer), ("seed", sa.BigInteger),
        ("request", sa.JSON), ("resolved", sa.JSON), ("result_files", sa.JSON), ("request_hash", sa.String),
        ("cancel_requested", sa.Boolean), ("pause_requested", sa.Boolean), ("created_at", sa.BigInteger))))
    old_resolved = {"hyperparameters": {"n_epochs": 2, "beta": 0.2}, "lora": {"rank": 4}, "gpus": 1}
    rows = (("ftjob-dpo", {"model": "m", "training_file": "f", "method": {"type": "dpo"},
                           "training_type": {"type": "qlora"}}, old_resolved),
            ("ftjob-plain", {"model": "m", "training_file": "f"}, old_resolved),
            ("ftjob-unvalidated", {"model": "m", "training_file": "f"}, sa.null()))
    try:
        with engine.begin() as connection:
            connection.execute(sa.insert(tenants).values(tenant_id="tenant-1", name="alpha", tier="standard",
                                                         created_at=0))
            for job_id, request, resolved in rows:
                connection.execute(sa.insert(jobs_0006).values(
                    job_id=job_id, tenant_id="tenant-1", model="m", base_model_sha256="0" * 64, training_file="f",
                    status="queued", attempt=0, seed=1, request=request, resolved=resolved, result_files=[],
                    request_hash="0" * 64, cancel_requested=False, pause_requested=False, created_at=0))
        upgrade(database_url)
        with Session(engine) as session:
            jobs = {job.job_id: job for job in session.scalars(sa.select(Job))}
        dpo, plain = jobs["ftjob-dpo"].resolved, jobs["ftjob-plain"].resolved
        assert (dpo.method, dpo.training_type) == ("dpo", "qlora")
        assert (plain.method, plain.training_type) == ("supervised", "lora")
        assert dpo.hyperparameters.method_options["beta"] == 0.2 and dpo.lora.rank == 4  # the rest of the row as it was
        assert jobs["ftjob-unvalidated"].resolved is None
        assert jobs["ftjob-dpo"].request.method_type == "dpo"
    finally:
        engine.dispose()


def test_keys_issued_before_0008_get_unique_ids_and_keep_working(database_url):
    upgrade(database_url, "0007")
    engine = create_engine(database_url)
    tenants = sa.table("tenants", *(sa.column(name, kind) for name, kind in (
        ("tenant_id", sa.String), ("name", sa.String), ("tier", sa.String), ("created_at", sa.BigInteger))))
    keys_0007 = sa.table("api_keys", *(sa.column(name, kind) for name, kind in (
        ("tenant_id", sa.String), ("key_hash", sa.String), ("key_prefix", sa.String), ("created_at", sa.BigInteger),
        ("revoked_at", sa.BigInteger))))
    try:
        with engine.begin() as connection:
            connection.execute(sa.insert(tenants).values(tenant_id="tenant-1", name="alpha", tier="standard",
                                                         created_at=0))
            for n in range(3):
                connection.execute(sa.insert(keys_0007).values(
                    tenant_id="tenant-1", key_hash=tenant_repo.hash_key(f"tf-old-{n}"), key_prefix=f"tf-old-{n}",
                    created_at=n, revoked_at=5 if n == 2 else None))
        upgrade(database_url)
        with Session(engine) as session:
            keys = list(session.scalars(sa.select(ApiKey).order_by(ApiKey.pk)))
            assert [k.key_prefix for k in keys] == ["tf-old-0", "tf-old-1", "tf-old-2"]
            assert all(k.key_id.startswith("key-") for k in keys) and len({k.key_id for k in keys}) == 3
            assert all(k.expires_at is None and k.last_used_at is None and k.name is None for k in keys)
            assert tenant_repo.by_api_key(session, "tf-old-0").name == "alpha"
            assert tenant_repo.by_api_key(session, "tf-old-2") is None  # still revoked
        downgrade(database_url, "0007")
        assert "key_id" not in {c["name"] for c in inspect(engine).get_columns("api_keys")}
    finally:
        engine.dispose()
