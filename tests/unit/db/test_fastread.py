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
    platform = make_platform(tmp_path, database_url, database_pool_size=1)  # one read connection
    reads = platform.db.reads
    backend_pid = Prepared(platform.db.engine, select(text("pg_backend_pid()")))

    def pid() -> int:
        return asyncio.run(reads.call(backend_pid.rows))[0][0]

    first = pid()
    assert pid() == first  # one connection kept open, from one event loop to the next
    with platform.db.engine.connect() as admin:
        admin.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": first})
        admin.commit()
    second = pid()  # the read is tried again on a new connection, not failed
    assert second != first
    platform.db.dispose()
    assert reads.open_connections == 0
    other = make_platform(tmp_path / "again", database_url)
    try:
        with other.db.engine.connect() as check:
            alive = check.execute(text("SELECT count(*) FROM pg_stat_activity WHERE pid = :pid"), {"pid": second})
            assert alive.scalar() == 0
    finally:
        other.db.dispose()


def test_more_reads_than_connections_wait_their_turn_and_a_cancelled_read_costs_nothing(
        tmp_path, database_url, db_backend):
    if db_backend != "postgresql":
        pytest.skip("SQLite reads run on the pooled connections of the engine")
    platform = make_platform(tmp_path, database_url, database_pool_size=2)  # two read connections
    reads = platform.db.reads
    backend_pid = Prepared(platform.db.engine, select(text("pg_backend_pid()")))
    slow = Prepared(platform.db.engine, select(text("pg_backend_pid()"), text("pg_sleep(0.05)")))

    async def scenario() -> tuple[set[int], list[int]]:
        # 20 reads at once on 2 connections: every one answered, by one of the two servers
        pids = await asyncio.gather(*(reads.call(slow.rows) for _ in range(20)))
        # a read cancelled while it waits for a connection, and one cancelled mid-statement
        blockers = [asyncio.create_task(reads.call(slow.rows)) for _ in range(2)]
        await asyncio.sleep(0.01)
        waiting = asyncio.create_task(reads.call(backend_pid.rows))
        await asyncio.sleep(0.01)
        waiting.cancel()
        blockers[0].cancel()
        await asyncio.gather(*blockers, waiting, return_exceptions=True)
        after = await asyncio.gather(*(reads.call(backend_pid.rows) for _ in range(5)))
        return {row[0][0] for row in pids}, [row[0][0] for row in after]

    try:
        served, after = asyncio.run(scenario())
        assert len(served) == 2
        assert len(after) == 5 and reads.open_connections <= 2
        # the connection whose statement was cancelled was closed and replaced; the other kept
        assert len(set(after) - served) <= 1 and set(after) & served
    finally:
        platform.db.dispose()
    assert reads.open_connections == 0
