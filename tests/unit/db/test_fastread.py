"""db/fastread.py: prepared SELECTs bind by name on both dialects, rows rebuild the ORM's objects,
and the lean reads' own PostgreSQL connections survive a dropped connection and close with the
database."""

from __future__ import annotations

import asyncio
from functools import partial

import pytest
from sqlalchemy import bindparam, select, text

from tests.helpers.platform import add_running_job, make_platform
from tuneforge.db.fastread import NewestFirst, PlainRows, Prepared
from tuneforge.db.repos import jobs as job_repo
from tuneforge.db.tables import Job


def test_plain_rows_rebuild_the_object_the_orm_loads(tmp_path, database_url):
    platform = make_platform(tmp_path, database_url)
    try:
        _, tenant_id, job_id = add_running_job(platform, "alpha")
        plain = PlainRows(Job)
        by_id = Prepared(platform.db.engine, plain.select().where(Job.job_id == bindparam("job_id")))
        reads = platform.db.reads
        rows = asyncio.run(reads.call(partial(by_id.rows, job_id=job_id)))
        assert len(rows) == 1
        rebuilt = plain.to_object(tuple(rows[0]), platform.db.engine)
        with platform.db.session() as session:
            loaded = job_repo.get(session, tenant_id, job_id)
            for attr in ("job_id", "tenant_id", "status", "seed", "created_at", "result_files", "error",
                         "cancel_requested", "user_metadata", "resolved"):
                assert getattr(rebuilt, attr) == getattr(loaded, attr), attr
            assert rebuilt.request.to_json() == loaded.request.to_json()
            assert rebuilt.cancel_requested is False
        # a page reader: unknown cursor -> nothing; the rows after a known one
        pages = NewestFirst(platform.db.engine, select(Job.job_id).where(Job.tenant_id == bindparam("tenant_id")),
                            Job, Job.job_id)
        assert asyncio.run(reads.call(partial(pages.rows, after=None, limit=5, tenant_id=tenant_id))) == [(job_id,)]
        assert asyncio.run(reads.call(partial(pages.rows, after="ftjob-none", limit=5, tenant_id=tenant_id))) == []
        assert asyncio.run(reads.call(partial(pages.rows, after=job_id, limit=5, tenant_id=tenant_id))) == []
    finally:
        platform.db.dispose()


def test_a_dropped_postgresql_connection_is_replaced_and_connections_close_with_the_database(
        tmp_path, database_url, db_backend):
    if db_backend != "postgresql":
        pytest.skip("SQLite reads run on the pooled connections of the engine")
    platform = make_platform(tmp_path, database_url, database_pool_size=1)  # one read thread
    reads = platform.db.reads
    backend_pid = Prepared(platform.db.engine, select(text("pg_backend_pid()")))

    def pid() -> int:
        return asyncio.run(reads.call(backend_pid.rows))[0][0]

    first = pid()
    assert pid() == first  # one thread, one connection kept open
    with platform.db.engine.connect() as admin:
        admin.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": first})
        admin.commit()
    second = pid()  # the read is tried again on a new connection, not failed
    assert second != first
    platform.db.dispose()
    assert reads._opened == [] and reads._executor is None
    other = make_platform(tmp_path / "again", database_url)
    try:
        with other.db.engine.connect() as check:
            alive = check.execute(text("SELECT count(*) FROM pg_stat_activity WHERE pid = :pid"), {"pid": second})
            assert alive.scalar() == 0
    finally:
        other.db.dispose()
