"""Wake-ups for event followers (db/notify.py, db/listen.py): a commit that stored a job's events
wakes that job's waiters, a rollback or an uncommitted flush does not; on PostgreSQL the commit
also reaches other processes through LISTEN/NOTIFY, the listener comes back after its connection
is cut, and a job's events commit in pk order."""

from __future__ import annotations

import asyncio
import threading

import psycopg
import pytest
from sqlalchemy.exc import OperationalError

from tests.helpers.net import wait_until
from tests.helpers.platform import add_running_job, make_platform
from tuneforge.db.engine import savepoint
from tuneforge.db.listen import APPLICATION_NAME, EventListener, libpq_conninfo
from tuneforge.db.notify import HUB, JobEventHub
from tuneforge.db.repos import events
from tuneforge.db.repos import jobs as job_repo

WAIT_S = 30.0  # generous: these waits end as soon as the wake-up comes


async def _settle() -> None:
    """Let wake-ups already handed to the loop (call_soon_threadsafe) run."""
    for _ in range(5):
        await asyncio.sleep(0)


def _add_event(platform, job_id: str, message: str) -> None:
    with platform.db.session() as session:
        events.add(session, job_repo.get_for_update(session, job_id), message)


@pytest.fixture
def platform(tmp_path, database_url):
    platform = make_platform(tmp_path, database_url)
    yield platform
    platform.db.dispose()


def test_a_commit_wakes_the_jobs_waiters_and_nothing_earlier_does(platform):
    _, _, job_id = add_running_job(platform, "alpha")
    _, _, other_job_id = add_running_job(platform, "beta")

    async def scenario() -> None:
        with HUB.waiter(job_id) as waiter, HUB.waiter(other_job_id) as other:
            with pytest.raises(RuntimeError):
                with platform.db.session() as session:
                    events.add(session, job_repo.get_for_update(session, job_id), "rolled back")
                    raise RuntimeError("the request fails")
            await _settle()
            assert not waiter.woken

            with platform.db.session() as session:
                events.add(session, job_repo.get_for_update(session, job_id), "stored")
                session.flush()  # written, not visible to others yet: a follower woken now would find nothing
                await _settle()
                assert not waiter.woken
            await _settle()
            assert waiter.woken and not other.woken
            assert await waiter.wait(WAIT_S)  # the wake-up is consumed by the wait that sees it
            assert not waiter.woken

    asyncio.run(scenario())
    assert HUB.waiting(job_id) == 0  # the waiters left with their block


def test_events_in_a_savepoint_wake_at_the_outer_commit(platform):
    _, _, job_id = add_running_job(platform, "alpha")

    async def scenario() -> None:
        with HUB.waiter(job_id) as waiter:
            with platform.db.session() as session:
                job = job_repo.get_for_update(session, job_id)
                with savepoint(session):
                    events.add(session, job, "inside a savepoint")
                await _settle()
                assert not waiter.woken  # the savepoint is released, the transaction not committed
            await _settle()
            assert waiter.woken

    asyncio.run(scenario())


def test_a_wake_up_from_another_thread_ends_the_wait():
    hub = JobEventHub()

    async def scenario() -> tuple[bool, bool]:
        with hub.waiter("ftjob-x") as waiter:
            timed_out = await waiter.wait(0.01)
            threading.Thread(target=hub.notify, args=(["ftjob-x", "ftjob-unrelated"],)).start()
            return timed_out, await waiter.wait(WAIT_S)

    assert asyncio.run(scenario()) == (False, True)


# ---- PostgreSQL -----------------------------------------------------------------------------------

@pytest.fixture
def postgres_only(db_backend):
    if db_backend != "postgresql":
        pytest.skip("LISTEN/NOTIFY and row locks are PostgreSQL's")


def test_events_of_one_job_commit_in_pk_order(platform, postgres_only):
    """A second transaction adding an event of the same job waits for the first to commit, so a
    follower that has read the newer pk can never miss an older one that commits later."""
    _, tenant_id, job_id = add_running_job(platform, "alpha")
    with platform.db.session() as first:
        events.add(first, job_repo.get(first, tenant_id, job_id), "first")
        first.flush()  # pk taken, not committed
        with pytest.raises(OperationalError, match="lock"):
            with platform.db.session() as second:
                second.connection().exec_driver_sql("SET LOCAL lock_timeout = '100ms'")
                events.add(second, job_repo.get(second, tenant_id, job_id), "second")
    _add_event(platform, job_id, "second, once the first has committed")
    with platform.db.session() as session:
        stored = [e.message for e in events.since(session, tenant_id, job_id, 0)]
    assert stored == ["first", "second, once the first has committed"]


def test_a_commit_reaches_other_processes_through_listen_and_the_listener_reconnects(platform, postgres_only):
    _, _, job_id = add_running_job(platform, "alpha")
    # A hub of its own: only a notification that went through PostgreSQL can wake it.
    elsewhere = JobEventHub()
    listener = EventListener(platform.db.url, elsewhere)
    listener.start()
    try:
        wait_until(lambda: listener.connected, WAIT_S, "the listener to connect")

        async def one_commit(message: str) -> bool:
            with elsewhere.waiter(job_id) as waiter:
                await asyncio.to_thread(_add_event, platform, job_id, message)
                return await waiter.wait(WAIT_S)

        assert asyncio.run(one_commit("seen by another process"))

        with psycopg.connect(libpq_conninfo(platform.db.url), autocommit=True) as admin:
            cut = admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                "WHERE application_name = %s AND datname = current_database()",
                                (APPLICATION_NAME,)).fetchall()
        assert cut == [(True,)]
        wait_until(lambda: listener.connects >= 2 and listener.connected, WAIT_S, "the listener to reconnect")
        assert asyncio.run(one_commit("seen after the reconnect"))
    finally:
        listener.stop()
    assert not listener.connected
