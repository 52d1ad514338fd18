"""A co-training pool as a job the scheduler places (`services/training_api/scheduled.py`): the job
of the platform's own tenant (no key, no quota), its attempt's spec (the worker, not a training
loop), its worker's job token as the pool's credential, and a pool job whose process stopped
marking it (its broker is gone) cancelled by the scheduler. (Its flow with a real scheduler,
worker, preemption and an ordinary job waiting for its slot: tests/e2e/test_training_api.py.)"""

from __future__ import annotations

import asyncio
import hashlib
import time

import pytest

from tuneforge.db.repos import base_models as base_model_repo
from tuneforge.db.tables import ApiKey, Attempt, Job, Tenant
from tuneforge.domain.spec import POOL_METHOD
from tuneforge.scheduler.spec_builder import build_spec
from tuneforge.services.tenancy import quotas
from tuneforge.services.training_api.broker import Pool
from tuneforge.services.training_api.scheduled import (
    OWNER_GONE_S,
    POOLS_TENANT,
    ScheduledPools,
    cancel_stale,
    create_pool_job,
    is_pool_job,
)


def pool_job(world, pool: Pool) -> str:
    with world.platform.db.session() as session:
        base = base_model_repo.by_name(session, world.base_model)
        return create_pool_job(session, base, pool, max_pass_tokens=4096).job_id


def test_a_pool_job_belongs_to_the_platform_runs_the_worker_and_is_never_held_by_a_quota(world) -> None:
    pool = Pool("pool-abc", world.base_model, "")
    job_id = pool_job(world, pool)
    second = pool_job(world, Pool("pool-def", world.base_model, ""))
    with world.platform.db.session() as session:
        job = session.query(Job).filter(Job.job_id == job_id).one()
        tenant = session.query(Tenant).filter(Tenant.tenant_id == job.tenant_id).one()
        assert tenant.name == POOLS_TENANT and is_pool_job(job) and job.status == "queued"
        assert session.query(Job).filter(Job.job_id == second).one().tenant_id == tenant.tenant_id  # one tenant
        assert session.query(ApiKey).filter(ApiKey.tenant_id == tenant.tenant_id).count() == 0  # no key
        gate = quotas.start_gate(session, {tenant.tenant_id: 1000})
        assert all(gate(tenant.tenant_id) for _ in range(50))  # no limit holds a pool back

        spec = build_spec(session, world.platform.settings, job, 1, "job-token")
        assert (spec.method, spec.gpus, spec.job_token) == (POOL_METHOD, 1, "job-token")
        assert spec.extra == {"pool_id": "pool-abc", "max_pass_tokens": 4096}
        assert spec.base_model.name == world.base_model and spec.base_model.sha256 == job.base_model_sha256
        assert spec.callback_url == world.platform.settings.resolved_public_url
        job.base_model_sha256 = "0" * 64  # the base was replaced since: the attempt is not started on it
        with pytest.raises(LookupError, match="replaced"):
            build_spec(session, world.platform.settings, job, 1, "job-token")
        session.rollback()
    # the tenant API never shows the platform's jobs
    assert [j.id for j in world.sdk(world.key_a).fine_tuning.jobs.list().data] == []


def test_the_worker_is_known_by_its_running_attempts_job_token_and_nothing_else(world) -> None:
    pool = Pool("pool-xyz", world.base_model, "")
    job_id = pool_job(world, pool)

    async def scenario() -> None:
        pools = ScheduledPools(world.platform, asyncio.get_running_loop())
        assert await pools.authorize("pool-xyz", "anything") is None  # not a pool of this process
        pools.jobs["pool-xyz"] = job_id
        assert await pools.authorize("pool-xyz", "token-1") is None  # no attempt yet
        with world.platform.db.session() as session:
            session.add(Attempt(job_id=job_id, number=1, status="running", heartbeat_at=time.time(),
                                started_at=time.time(), token_hash=hashlib.sha256(b"token-1").hexdigest()))
        assert await pools.authorize("pool-xyz", "token-1") == 1
        assert await pools.authorize("pool-xyz", "token-2") is None
        assert await pools.authorize("pool-other", "token-1") is None
        with world.platform.db.session() as session:
            session.query(Attempt).filter(Attempt.job_id == job_id).one().status = "preempted"
            session.add(Attempt(job_id=job_id, number=2, status="starting", heartbeat_at=time.time(),
                                started_at=time.time(), token_hash=hashlib.sha256(b"token-2").hexdigest()))
        assert await pools.authorize("pool-xyz", "token-2") == 2  # the next attempt takes over
        assert await pools.authorize("pool-xyz", "token-1") is None  # the one before it no longer counts

    asyncio.run(scenario())


def test_a_pool_job_whose_process_stopped_marking_it_is_cancelled_and_a_served_one_is_not(world) -> None:
    served = pool_job(world, Pool("pool-1", world.base_model, ""))
    left = pool_job(world, Pool("pool-2", world.base_model, ""))
    ended = pool_job(world, Pool("pool-3", world.base_model, ""))
    with world.platform.db.session() as session:
        session.query(Job).filter(Job.job_id == ended).one().status = "cancelled"
    assert cancel_stale(world.platform) == []  # just made: their process marked them
    later = time.time() + OWNER_GONE_S + 5

    async def scenario() -> None:
        pools = ScheduledPools(world.platform, asyncio.get_running_loop())
        pools.jobs["pool-1"] = served
        pools.mark_owned()

    original = time.time
    try:  # the owning process marks only its own pools' jobs, at its "now"
        time.time = lambda: later  # type: ignore[assignment]
        asyncio.run(scenario())
    finally:
        time.time = original  # type: ignore[assignment]
    assert cancel_stale(world.platform, now=later) == [left]
    with world.platform.db.session() as session:
        job = session.query(Job).filter(Job.job_id == left).one()
        assert job.status == "cancelled" and job.cancel_requested
        assert session.query(Job).filter(Job.job_id == served).one().status == "queued"
    assert cancel_stale(world.platform, now=later) == []
