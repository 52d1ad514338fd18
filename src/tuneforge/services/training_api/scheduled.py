"""Co-training workers as jobs the scheduler places: one job per (base model, pool), owned by the
platform's own tenant (`POOLS_TENANT`, no API key), whose single GPU-holding attempt runs the
worker (`train/cotrain_worker.run_pool_attempt`) instead of a training loop.

So a pool takes its GPUs from the scheduler like any job, on whichever executor the platform runs
(the local one, or Ray: the worker is then a Ray actor on the node the scheduler chose): ordinary
jobs are not placed on them, its lease is its heartbeats, and the scheduler preempts it like any
attempt. Its life:

- the broker needs a worker for a base (`launch`): a queued job is written; the scheduler starts
  it when its GPUs are free;
- the worker asks for work with its attempt's job token, checked against the attempt
  (`authorize`: no secret of its own is stored);
- preempted (checkpoint-then-requeue, a reclaimed node): the worker hands every hosted model's
  state back and exits 12; the job is requeued like any and started again where the scheduler
  finds GPUs, and its new worker loads those states with each model's next op — restarted
  elsewhere, nothing lost. A worker that crashed is retried like any attempt (what it ran fails,
  the platform's fault);
- idle (`retire`): the job is cancelled first, then the worker is told to stop;
- the process whose broker a pool serves marks the pool's job every OWNER_EVERY_S; a job unmarked
  for OWNER_GONE_S (its process stopped, crashed or restarted: its broker is gone) is cancelled by
  the scheduler's housekeeping, freeing its GPUs.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import threading
import time
from typing import Any

from tuneforge.db.repos import pool_jobs
from tuneforge.db.tables import Job, Tenant
from tuneforge.domain.ids import new_id
from tuneforge.domain.job_config import JobRequest
from tuneforge.domain.resolved import ResolvedJob, ResolvedResources
from tuneforge.domain.spec import POOL_METHOD
from tuneforge.domain.status import TERMINAL, JobStatus
from tuneforge.services.training_api.broker import Broker, Pool, stop_now

log = logging.getLogger(__name__)

POOLS_TENANT = "platform:training-api"  # not a name a tenant can take (services/tenancy/tenants.py)
WATCH_S = 0.5
# the process whose broker a pool serves marks its job every OWNER_EVERY_S; a pool job unmarked for
# OWNER_GONE_S belongs to a process that is gone (stopped, crashed, restarted): the scheduler's
# housekeeping cancels it (`cancel_stale`), so that its GPUs are not held for a broker nobody has
OWNER_EVERY_S = 15.0
OWNER_GONE_S = 120.0


def pools_tenant_id(session: Any) -> str:
    """The platform's own tenant that owns the pools' jobs: no API key, no quota (-1: unlimited)."""
    row = pool_jobs.tenant_named(session, POOLS_TENANT)
    if row is None:
        row = Tenant(tenant_id=new_id("tenant", 16), name=POOLS_TENANT, tier="standard", created_at=int(time.time()),
                     max_concurrent_jobs=-1, max_queued_jobs=-1, gpu_hours_hard=-1, gpu_hours_soft=-1)
        session.add(row)
        session.flush()
    return row.tenant_id


def create_pool_job(session: Any, base: Any, pool: Pool, *, max_pass_tokens: int, gpus: int = 1) -> Job:
    from tuneforge.db.repos import events

    job = Job(job_id=new_id("ftjob"), tenant_id=pools_tenant_id(session), model=base.name,
              base_model_sha256=base.sha256, training_file="", status=JobStatus.QUEUED.value, attempt=0, seed=0,
              user_metadata={"training_api_pool": pool.pool_id, "owner_seen_at": str(int(time.time()))},
              request=JobRequest(model=base.name, training_file=""),
              resolved=ResolvedJob(method=POOL_METHOD, resources=ResolvedResources(gpus=gpus),
                                   extra={"pool_id": pool.pool_id, "max_pass_tokens": max_pass_tokens}),
              result_files=[], request_hash="", created_at=int(time.time()))
    session.add(job)
    session.flush()
    events.add(session, job, f"Co-training pool {pool.pool_id} for {base.name}: waiting for {gpus} GPU(s)",
               data={"pool": pool.pool_id})
    return job


def is_pool_job(job: Job) -> bool:
    return job.resolved is not None and job.resolved.method == POOL_METHOD


def _cancel(session: Any, job: Job, why: str) -> None:
    from tuneforge.services.training.transitions import transition

    if _ended(job.status):
        return
    job.cancel_requested = True
    transition(session, job, JobStatus.CANCELLED, f"Co-training pool stopped: {why}")


def cancel_stale(platform: Any, now: float | None = None) -> list[str]:
    """The pool jobs whose owning process stopped marking them for OWNER_GONE_S: cancelled (their
    workers answer to a broker that no longer exists)."""
    now = time.time() if now is None else now
    with platform.db.session() as session:
        tenant = pool_jobs.tenant_named(session, POOLS_TENANT)
        if tenant is None:
            return []
        jobs = pool_jobs.unfinished_of(session, tenant.tenant_id, (
            JobStatus.QUEUED.value, JobStatus.RUNNING.value, JobStatus.PAUSED.value))
        stale = [job for job in jobs if now - _owner_seen(job) > OWNER_GONE_S]
        for job in stale:
            _cancel(session, job, "the control plane process that ran it is gone")
        return [job.job_id for job in stale]


def _owner_seen(job: Job) -> float:
    try:
        return float((job.user_metadata or {}).get("owner_seen_at") or job.created_at)
    except ValueError:
        return float(job.created_at)


class ScheduledPools:
    """The broker's `launch` / `retire` for pools that are scheduled jobs (see the module)."""

    def __init__(self, platform: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.platform = platform
        self.loop = loop
        self.broker: Broker | None = None
        self.jobs: dict[str, str] = {}  # pool id -> its job
        # pool id -> (SHA-256 of the job token its serving attempt was checked with, that attempt)
        self._accepted: dict[str, tuple[str, int]] = {}

    # the broker's side (on the event loop) -----------------------------------------------------------
    def launch(self, pool: Pool) -> None:
        threading.Thread(target=self._run, args=(pool,), name=f"cotrain-{pool.pool_id}", daemon=True).start()

    def retire(self, pool: Pool) -> None:
        """An idle pool: its job is cancelled (so the scheduler neither retries nor requeues it),
        then its worker is told to stop."""
        def cancel() -> None:
            job_id = self.jobs.get(pool.pool_id)
            try:
                if job_id is not None:
                    with self.platform.db.session() as session:
                        job = pool_jobs.by_id(session, job_id)
                        if job is not None:
                            _cancel(session, job, "idle")
            except Exception:  # noqa: BLE001 - the worker still stops; a job left behind is reaped at restart
                log.exception("cancelling the job of pool %s", pool.pool_id)
            self.loop.call_soon_threadsafe(stop_now, pool)

        threading.Thread(target=cancel, name=f"retire-{pool.pool_id}", daemon=True).start()

    async def authorize(self, pool_id: str, token: str) -> int | None:
        """The attempt of the pool's job whose job token `token` is, while it holds its GPUs; None
        when it is no such attempt's (checked against the database once per attempt)."""
        digest = hashlib.sha256(token.encode()).hexdigest()
        known = self._accepted.get(pool_id)
        if known is not None and secrets.compare_digest(known[0], digest):
            return known[1]
        job_id = self.jobs.get(pool_id)
        if job_id is None:
            return None

        def check() -> int | None:
            with self.platform.db.session() as session:
                attempt = pool_jobs.current_attempt(session, job_id, digest)
                return None if attempt is None else attempt.number

        from starlette.concurrency import run_in_threadpool

        number = await run_in_threadpool(check)
        if number is not None:
            self._accepted[pool_id] = (digest, number)
        return number

    def mark_owned(self) -> None:
        """This process still serves its pools: their jobs are marked so (blocking: from a thread)."""
        job_ids = list(self.jobs.values())
        if not job_ids:
            return
        stamp = str(int(time.time()))
        with self.platform.db.session() as session:
            for job in pool_jobs.by_ids(session, job_ids):
                job.user_metadata = {**(job.user_metadata or {}), "owner_seen_at": stamp}

    def stop_all(self, wait_s: float) -> None:
        """The process stops: every pool's job is cancelled (their workers are told to stop)."""
        with self.platform.db.session() as session:
            for job_id in list(self.jobs.values()):
                job = pool_jobs.by_id(session, job_id)
                if job is not None:
                    _cancel(session, job, "the control plane stopped")

    # the watcher (a thread per pool) ---------------------------------------------------------------------
    def _run(self, pool: Pool) -> None:
        why = "it could not be started"
        try:
            with self.platform.db.session() as session:
                from tuneforge.services.serving import base_models

                base = base_models.find(session, pool.base)
                if base is None:
                    raise LookupError(pool.base)
                job = create_pool_job(session, base, pool,
                                      max_pass_tokens=self.platform.settings.training_api_cycle_tokens)
                job_id = job.job_id
            self.jobs[pool.pool_id] = job_id
            why = self._watch(pool, job_id)
        except Exception:  # noqa: BLE001 - logged; the pool's requests fail as the platform's fault
            log.exception("co-training pool of %s", pool.base)
        finally:
            self.jobs.pop(pool.pool_id, None)
            self._accepted.pop(pool.pool_id, None)
        if self.broker is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.broker.worker_lost, pool, why)

    def _watch(self, pool: Pool, job_id: str) -> str:
        """Until the pool's job ends. When the attempt serving the pool ends and the job waits for
        GPUs again (preempted, or retried after a crash), the broker hears it (`attempt_ended`);
        the scheduler starts the job again like any, and its new worker takes over the pool."""
        while True:
            time.sleep(WATCH_S)
            with self.platform.db.session() as session:
                job = pool_jobs.by_id(session, job_id)
                if job is None:
                    return f"its job {job_id} is gone"
                status, attempt = job.status, job.attempt
            if _ended(status):
                return f"its job {job_id} {status}"
            if status == JobStatus.QUEUED.value and attempt >= 1 and self.broker is not None:
                self.loop.call_soon_threadsafe(self.broker.attempt_ended, pool, attempt,
                                               f"attempt {attempt} of its job ended; it waits for GPUs again")


def _ended(status: str) -> bool:
    return status in {terminal.value for terminal in TERMINAL}
