"""The scheduler loop: one tick validates new jobs, reconciles running
attempts with what the executor reports, and starts queued jobs in order
while there is capacity, then runs the periodic duties that are due
(scheduler/housekeeping.py). Each phase commits on its own so a failure in
one job never blocks the others."""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import Counter
from dataclasses import replace
from typing import Any

from sqlalchemy.orm import Session

from tuneforge.db.repos import attempts as attempt_repo
from tuneforge.db.repos import events
from tuneforge.db.repos import jobs as job_repo
from tuneforge.db.repos import tenants as tenant_repo
from tuneforge.db.tables import Attempt, Job
from tuneforge.domain.exit_codes import TrainerExit, describe
from tuneforge.domain.ids import correlation_id
from tuneforge.domain.status import AttemptStatus, JobStatus
from tuneforge.domain.tenant_text import scrub
from tuneforge.executors.protocol import Capacity, Executor, Placement, PollResult
from tuneforge.planning.policy import Hold, PolicyConfig, QueuedJob, QueueIndex, RunningJob, decide
from tuneforge.planning.pools import PoolSetup
from tuneforge.scheduler.housekeeping import Housekeeping, platform_duties
from tuneforge.scheduler.leader import LeaderLock
from tuneforge.scheduler.spec_builder import build_spec
from tuneforge.services.context import Platform
from tuneforge.services.tenancy import quotas, usage
from tuneforge.services.training import artifacts
from tuneforge.services.training import sweeps as sweep_service
from tuneforge.services.training.cluster_state import ClusterState, placement_spans, read_state
from tuneforge.services.training.reports import token_hash
from tuneforge.services.training.trainer_logs import LOG_KEEP_BYTES, LogKeeper
from tuneforge.services.training.transitions import transition
from tuneforge.services.training.validation import validate_job

log = logging.getLogger("tuneforge.scheduler")


class Scheduler:
    def __init__(self, platform: Platform, executor: Executor, policy: PolicyConfig | None = None) -> None:
        self.platform = platform
        self.executor = executor
        settings = platform.settings
        self.policy = policy or PolicyConfig.from_settings(settings)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.leader = LeaderLock(settings.resolved_database_url, settings.home)
        self._leading_since = 0.0  # when this process last became the one scheduling (0: tick() called directly)
        # GPUs being freed by preemption, promised to the job they are freed for. Kept in
        # memory: a new leader starts without holds, and preempts again if it must.
        self._holds: dict[str, Hold] = {}
        # periodic duties (purges, expiry, leftovers, vLLM sync, reaping): scheduler/housekeeping.py
        self.housekeeping = Housekeeping(platform_duties(platform, executor))
        self.logs = LogKeeper(settings, platform.store)  # trainers' output, kept for their tenants
        self.pools = PoolSetup.from_settings(settings)  # capacity pools (planning/pools.py); None: not configured

    # ---- the tick -------------------------------------------------------
    def tick(self) -> None:
        # what the executor has first: validation checks new jobs against it, admission places on it
        try:
            self.platform.inventory = self.executor.capacity()
            inventory_known = True
        except Exception:  # noqa: BLE001 - e.g. a Ray head restarting: admit nothing until it answers again
            log.exception("the executor could not say what it has; no job starts this tick")
            inventory_known = False
        if self.platform.inventory is not None:  # validation checks that a job fits the inventory
            self._validate_new_jobs()
            self._reclaim_draining(self.platform.inventory)
        self._reconcile_attempts()
        self._keep_logs()
        sweep_service.advance(self.platform)  # follows trials, stops weak ones, creates the next (validated below)
        if inventory_known:
            self._admit_queued_jobs()
        self._release_ended()
        self.housekeeping.run_due()

    def _release_ended(self) -> None:
        """An attempt that ended — by its result or failure report, its exit, a cancel, a lost
        lease or node — may still hold what the executor gave it (a Ray placement group keeps
        its GPUs until removed). Each is released once its processes are gone, or once the
        preemption grace has passed since its end, and marked so (`released_at` in its handle).
        Attempts older than the window are left to `reap`."""
        now = time.time()
        grace_s = self.platform.settings.preempt_grace_s
        with self.platform.db.session() as session:
            pending = [(tenant_id, a.job_id, a.number)
                       for tenant_id, a in attempt_repo.ended_since(session, now - max(600.0, 2 * grace_s))
                       if a.handle and not a.handle.get("released_at")]
        for tenant_id, job_id, number in pending:
            try:
                with self.platform.db.session() as session:
                    attempt = attempt_repo.current(session, tenant_id, job_id, number)
                    handle = attempt.handle if attempt is not None else None
                    if not handle or handle.get("released_at"):
                        continue
                    if now - (attempt.ended_at or now) < grace_s and \
                            self.executor.poll(handle).state in ("running", "unknown"):
                        continue  # still flushing its last reports, or checkpointing
                    if not tenant_repo.is_deleted(session, tenant_id):  # a deleted tenant's prefix stays empty
                        self._keep_log(tenant_id, attempt, handle, final=True)  # its last lines, while they are there
                    self.executor.release(handle)
                    attempt.handle = {**handle, "released_at": now}
            except Exception:  # noqa: BLE001 - one broken attempt must not stop the loop
                log.exception("releasing %s attempt %s failed", job_id, number)

    def _keep_logs(self) -> None:
        """Copy running trainers' output to the store for their tenants (services/training/trainer_logs.py)."""
        now = time.time()
        with self.platform.db.session() as session:
            running = [(tenant_id, a.job_id, a.number, a.token_hash, a.handle)
                       for tenant_id, a in attempt_repo.active_with_tenant(session)
                       if a.handle and self.logs.due(a.job_id, a.number, now)]
        for tenant_id, job_id, number, hashed, handle in running:
            try:
                self.logs.copy(self.executor.log_tail(handle, LOG_KEEP_BYTES), tenant_id=tenant_id, job_id=job_id,
                               attempt=number, token_hash=hashed, final=False)
            except Exception:  # noqa: BLE001 - a log not copied must not stop the loop
                log.exception("copying the output of %s attempt %s failed", job_id, number)

    def _keep_log(self, tenant_id: str, attempt: Attempt, handle: dict, *, final: bool) -> None:
        try:
            self.logs.copy(self.executor.log_tail(handle, LOG_KEEP_BYTES), tenant_id=tenant_id,
                           job_id=attempt.job_id, attempt=attempt.number, token_hash=attempt.token_hash, final=final)
        except Exception:  # noqa: BLE001 - the release goes on without it
            log.exception("copying the output of %s attempt %s failed", attempt.job_id, attempt.number)

    def _validate_new_jobs(self) -> None:
        with self.platform.db.session() as session:
            pending = [j.job_id for j in job_repo.with_status(session, [JobStatus.VALIDATING_FILES.value])]
        for job_id in pending:
            with self.platform.db.session() as session:
                job = job_repo.get_for_update(session, job_id)
                if job is not None and job.status == JobStatus.VALIDATING_FILES.value:
                    validate_job(session, self.platform, job)

    def _reconcile_attempts(self) -> None:
        with self.platform.db.session() as session:
            active = [(a.job_id, a.number) for a in attempt_repo.active(session)]
        for job_id, number in active:
            try:
                with self.platform.db.session() as session:
                    self._reconcile_one(session, job_id, number)
            except Exception:  # noqa: BLE001 - one broken attempt must not stop the loop
                log.exception("reconciling %s attempt %s failed", job_id, number)

    def _reconcile_one(self, session: Session, job_id: str, number: int) -> None:
        job = job_repo.get_for_update(session, job_id)
        attempt = attempt_repo.current(session, job.tenant_id, job_id, number) if job is not None else None
        if job is None or attempt is None or attempt.status not in ("starting", "running"):
            return
        handle = attempt.handle or {}
        if job.status == JobStatus.CANCELLED.value or job.cancel_requested:
            if handle:
                self.executor.signal(handle, "cancel")
            _end_attempt(attempt, AttemptStatus.CANCELLED, None)
            if job.status != JobStatus.CANCELLED.value:  # asked for, but a launch got in between
                transition(session, job, JobStatus.CANCELLED, "Fine-tuning job cancelled")
            artifacts.discard_checkpoints(session, self.platform.store, job)
            return
        if (job.pause_requested or handle.get("reclaim_requested")) and handle and not handle.get("preempt_sent"):
            self.executor.signal(handle, "preempt")  # checkpoint and stop; the exit is handled below
            attempt.handle = {**handle, "preempt_sent": time.time()}
        poll = self.executor.poll(handle) if handle else PollResult("unknown")
        # a control plane that just started (or just took over) has heard no heartbeat yet:
        # every lease counts from then at the earliest, so downtime alone never loses an attempt
        heard = max(attempt.heartbeat_at, self._leading_since)
        settings = self.platform.settings
        # before its first heartbeat a trainer is importing and loading: it gets the start timeout
        limit = settings.lease_timeout_s if attempt.status == "running" else \
            max(settings.lease_timeout_s, settings.start_timeout_s)
        if poll.state == "running":
            if time.time() - heard > limit:
                self.executor.signal(handle, "cancel")
                _end_attempt(attempt, AttemptStatus.LOST, None, "platform")
                self._retry_or_fail(session, job, attempt, "lease expired: no heartbeat")
            return
        if poll.state == "unknown" and time.time() - heard <= limit:
            return  # launched by another process and maybe still alive: trust the lease
        self._handle_exit(session, job, attempt, poll, handle)

    def _handle_exit(self, session: Session, job: Job, attempt: Attempt, poll: PollResult, handle: dict) -> None:
        code = poll.exit_code
        if code == TrainerExit.PREEMPTED:
            _end_attempt(attempt, AttemptStatus.PREEMPTED, code, "preempted")
            if job.pause_requested:
                job.pause_requested = False
                transition(session, job, JobStatus.PAUSED,
                           f"Fine-tuning job paused after a checkpoint (attempt {attempt.number})",
                           data={"attempt": attempt.number})
                return
            transition(session, job, JobStatus.QUEUED,
                       f"Attempt {attempt.number} was preempted after a checkpoint; the job is requeued",
                       data={"code": "job_restarted", "attempt": attempt.number})
            return
        if code == TrainerExit.USER_ERROR:
            _end_attempt(attempt, AttemptStatus.FAILED, code, "user")
            if job.status == JobStatus.FAILED.value:
                return  # the trainer's failure report already failed the job with its code
            error = self._error_of(job, attempt, handle, "training_failed",
                                   "Training stopped on a problem with the data or the configuration")
            transition(session, job, JobStatus.FAILED, f"Fine-tuning job failed: {error['message']}",
                       level="error", error=error, data={"correlation_id": error["correlation_id"]})
            return
        if code == TrainerExit.REPORT_REFUSED:  # deterministic: the same report would be refused again
            _end_attempt(attempt, AttemptStatus.FAILED, code, "report_refused")
            if job.status != JobStatus.FAILED.value:  # the trainer's failure report did not get through
                error = self._error_of(job, attempt, handle, "report_refused",
                                       "The control plane refused a report of the training process")
                transition(session, job, JobStatus.FAILED, f"Fine-tuning job failed: {error['message']}",
                           level="error", error=error, data={"correlation_id": error["correlation_id"]})
            return
        if code == TrainerExit.OUT_OF_MEMORY:
            _end_attempt(attempt, AttemptStatus.FAILED, code, "out_of_memory")
            self._retry_smaller_or_fail(session, job, attempt)
            return
        _end_attempt(attempt, AttemptStatus.FAILED if code is not None else AttemptStatus.LOST, code, "platform")
        reason = f"trainer exited: {describe(code)}" if poll.state == "exited" else poll.detail
        self._retry_or_fail(session, job, attempt, reason, handle)

    def _retry_smaller_or_fail(self, session: Session, job: Job, attempt: Attempt) -> None:
        """Out of memory: the same effective batch in micro-batches half as large (twice the
        gradient accumulation), down to 1; then the job fails with advice."""
        resolved = job.resolved  # a job that ran was resolved; None is handled as "cannot shrink"
        hp = resolved.hyperparameters if resolved is not None else None
        micro, batch = (hp.micro_batch_size, hp.batch_size) if hp is not None else (1, 1)
        if resolved is not None and micro > 1:
            smaller = micro // 2
            job.resolved = replace(resolved, hyperparameters=replace(
                resolved.hyperparameters, micro_batch_size=smaller, gradient_accumulation_steps=-(-batch // smaller)))
            transition(session, job, JobStatus.QUEUED,
                       f"Attempt {attempt.number} ran out of memory with micro-batch {micro}; retrying with "
                       f"micro-batch {smaller} and gradient accumulation {-(-batch // smaller)} (same batch size "
                       f"{batch})", level="warn",
                       data={"code": "job_restarted", "attempt": attempt.number, "micro_batch_size": smaller})
            return
        max_seq = hp.max_seq_length if hp is not None else None
        message = (f"The training step does not fit in memory even with micro-batch 1 (batch size {batch}, "
                   f"max_seq_length {max_seq}). Lower max_seq_length (long examples are truncated or rejected "
                   "per data.long_examples), use a smaller LoRA rank or training_type qlora, or ask for GPUs "
                   "with more memory (resources.gpu_memory_gb).")
        transition(session, job, JobStatus.FAILED, f"Fine-tuning job failed: {message}", level="error",
                   error={"code": "out_of_memory", "message": message, "param": None})

    def _retry_or_fail(self, session: Session, job: Job, attempt: Attempt, reason: str,
                       handle: dict | None = None) -> None:
        """A platform failure: retried with exponential backoff up to the configured count."""
        settings = self.platform.settings
        failures = sum(1 for a in attempt_repo.for_job(session, job.tenant_id, job.job_id)
                       if a.failure_class == "platform")
        reason = scrub(reason, 300)  # an executor's detail or a launch exception may name host paths
        if failures < settings.max_attempt_failures:
            delay = min(settings.retry_backoff_max_s, settings.retry_backoff_s * 2 ** (failures - 1))
            job.not_before = time.time() + delay
            transition(session, job, JobStatus.QUEUED,
                       f"Attempt {attempt.number} ended ({reason}); the job is requeued and resumes from its last "
                       f"checkpoint in {delay:.0f} s", level="warn",
                       data={"code": "job_restarted", "attempt": attempt.number, "retry_in_s": delay})
            return
        error = self._error_of(job, attempt, handle or attempt.handle or {}, "platform_error",
                               f"The training process ended unexpectedly ({reason}); this is not a problem with "
                               "your data or configuration")
        transition(session, job, JobStatus.FAILED, f"Fine-tuning job failed after {failures} attempts: "
                                                   f"{error['message']}",
                   level="error", error=error, data={"correlation_id": error["correlation_id"]})

    def _error_of(self, job: Job, attempt: Attempt, handle: dict, code: str, message: str) -> dict:
        """The job's `error` for an attempt that ended badly: what its trainer reported, when it
        did (already scrubbed, `services/reports.tenant_error`); otherwise `code` and `message`
        with a new correlation id, under which the attempt's log tail goes to the operator's
        log — the tail itself (tracebacks, paths) is never shown to the tenant."""
        reported = attempt.failure or {}
        if reported.get("message"):
            return {key: reported.get(key) for key in ("code", "message", "param", "correlation_id")}
        error_id = correlation_id("err")
        tail = self.executor.log_tail(handle, 4000).strip() if handle else ""
        log.error("job %s attempt %d failed [%s]; its log ends with:\n%s", job.job_id, attempt.number,
                  error_id, tail)
        return {"code": code, "message": f"{message} (error id {error_id})", "param": None,
                "correlation_id": error_id}

    def _admit_queued_jobs(self) -> None:
        """One decision of the policy (`policy.decide`): holders first, then the queue in
        order with gang placement and EASY backfill, then checkpoint-then-requeue
        preemption for jobs that would wait past their tier's target; the GPUs a
        preemption frees are held for the job it was made for."""
        now = time.time()
        capacity = self.platform.capacity()
        if capacity is None:
            return
        with self.platform.db.session() as session:
            state = read_state(session, capacity, now, self.pools)
            allowed = quotas.start_gate(session, Counter(job.tenant_id for job in state.running))
        queue = QueueIndex(state.queued)
        self._holds = {job_id: hold for job_id, hold in self._holds.items() if job_id in queue and hold.until > now}
        decision = decide(queue, state.nodes, state.running, now, self.policy, state.recent_gpu_hours,
                          stopping=state.stopping, holds=self._holds, can_start=lambda job: allowed(job.tenant_id))
        pool_of = {node.name: node.pool for node in state.nodes}
        for job, assignment in decision.starts:
            self._holds.pop(job.job_id, None)
            try:
                self._launch(job.job_id, Placement.from_assignment(assignment) if assignment
                             else Placement("", []), pool_of.get(min(assignment), "") if assignment else "")
            except Exception:  # noqa: BLE001
                log.exception("launching %s failed", job.job_id)
        for job_id in state.moving:
            self._move_off_spot(job_id, state, now)
        for hold in decision.holds(now, self.policy):
            self._holds[hold.job_id] = hold
        for job, victims, _landing in decision.preemptions:
            self._preempt(job, victims, state, now)

    def _preempt(self, job: QueuedJob, victims: list[RunningJob], state: ClusterState, now: float) -> None:
        for victim in victims:
            number, handle = state.handles[victim.job_id]
            with self.platform.db.session() as session:
                victim_job = job_repo.get(session, victim.tenant_id, victim.job_id)
                attempt = attempt_repo.current(session, victim.tenant_id, victim.job_id, number)
                if victim_job is None or attempt is None or attempt.status not in ("starting", "running"):
                    continue
                if handle:
                    self.executor.signal(handle, "preempt")
                attempt.handle = {**(attempt.handle or {}), "preempt_sent": now}
                events.add(session, victim_job,
                           f"Preempting attempt {number} for a {job.tier} job that would wait past its target "
                           f"(waited {now - job.queued_at:.0f} s so far): checkpoint, then requeue",
                           level="warn", data={"for_job": job.job_id}, attempt=number)

    def _reclaim_draining(self, capacity: Capacity) -> None:
        """Attempts on nodes the executor reports draining (a reclaim notice) checkpoint and
        stop, as a reclaim sent to their pool does; their jobs resume elsewhere."""
        draining = {node.name for node in capacity.nodes if node.draining}
        if not draining:
            return
        with self.platform.db.session() as session:
            for attempt in attempt_repo.active(session):
                spans = placement_spans(attempt.placement)
                handle = attempt.handle or {}
                if draining & set(spans) and not handle.get("reclaim_requested"):
                    attempt.handle = {**handle, "reclaim_requested": time.time()}
                    job = job_repo.get_for_update(session, attempt.job_id)
                    if job is not None:
                        events.add(session, job, f"The node under attempt {attempt.number} is being reclaimed: it "
                                                 "checkpoints and the job resumes elsewhere", level="warn",
                                   data={"code": "capacity_reclaimed"}, attempt=attempt.number)

    def _move_off_spot(self, job_id: str, state: ClusterState, now: float) -> None:
        """An auto job whose deadline spot can no longer meet: checkpoint, then requeue (it starts
        again on on-demand, from its checkpoint)."""
        number, handle = state.handles[job_id]
        with self.platform.db.session() as session:
            job = job_repo.get_for_update(session, job_id)
            attempt = attempt_repo.current(session, job.tenant_id, job_id, number) if job is not None else None
            if job is None or attempt is None or attempt.status not in ("starting", "running"):
                return
            if handle:
                self.executor.signal(handle, "preempt")
            attempt.handle = {**(attempt.handle or {}), "preempt_sent": now}
            events.add(session, job, f"Moving off spot capacity: attempt {number} checkpoints and the job resumes "
                                     "on on-demand capacity, which can still meet its deadline", level="warn",
                       data={"code": "capacity_fallback", "reason": "deadline_at_risk"}, attempt=number)

    def _launch(self, job_id: str, placement: Placement, pool: str = "") -> None:
        token = secrets.token_urlsafe(32)
        with self.platform.db.session() as session:
            job = job_repo.get_for_update(session, job_id)
            if job is None or job.status != JobStatus.QUEUED.value:
                return
            tenant_id, number = job.tenant_id, job.attempt + 1
            spec = build_spec(session, self.platform.settings, job, number, token)
            job.attempt = number
            now = time.time()
            attempt = Attempt(
                job_id=job_id, number=number, status=AttemptStatus.STARTING.value, token_hash=token_hash(token),
                gpus=sum(len(ids) for ids in (placement.spans or {placement.node: placement.gpu_ids}).values()),
                placement=self._priced(placement, pool), heartbeat_at=now, started_at=now,
            )
            session.add(attempt)
            kind = self.pools.pools[pool].kind.replace("_", "-") if self.pools and pool in self.pools.pools else ""
            transition(session, job, JobStatus.RUNNING,
                       "Fine-tuning job started" + (f" (attempt {number})" if number > 1 else "")
                       + (f" on {kind} capacity (pool {pool})" if kind else ""),
                       data={"attempt": number, **({"pool": pool} if pool else {})})
        try:
            handle = self.executor.launch(spec, placement)
        except Exception as exc:  # noqa: BLE001 - record it, requeue or fail
            log.exception("launching attempt %d of %s failed", number, job_id)
            with self.platform.db.session() as session:
                job = job_repo.get_for_update(session, job_id)
                attempt = attempt_repo.current(session, tenant_id, job_id, number)
                _end_attempt(attempt, AttemptStatus.FAILED, None, "platform")
                self._retry_or_fail(session, job, attempt, f"launch failed: {exc}")
            return
        with self.platform.db.session() as session:
            attempt = attempt_repo.current(session, tenant_id, job_id, number)
            attempt.handle = handle

    def _priced(self, placement: Placement, pool: str) -> dict[str, Any]:
        """The placement as stored: where it runs, its pool and what a GPU-hour costs there (and
        on demand), so metering bills each attempt at its own pool's price."""
        if self.pools is None:
            price = usage.default_price(self.platform.settings)
            return {**placement.to_dict(), "pool": "", "price_per_gpu_hour": price,
                    "on_demand_price_per_gpu_hour": price}
        return {**placement.to_dict(), "pool": pool, "price_per_gpu_hour": self.pools.price(pool),
                "on_demand_price_per_gpu_hour": self.pools.on_demand_price()}

    # ---- the thread -----------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="tuneforge-scheduler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                leading = self.leader.holds()  # another control plane on this database may be scheduling
                if leading and self.platform.scheduler_role != "leader":
                    self._leading_since = time.time()
                    self._prepare_executor()
                self.platform.scheduler_role = "leader" if leading else "standby"
                if leading:
                    self.tick()
            except Exception:  # noqa: BLE001
                log.exception("scheduler tick failed")
            self._stop.wait(self.platform.settings.scheduler_tick_s)

    def _prepare_executor(self) -> None:
        try:
            self.executor.prepare()
        except Exception:  # noqa: BLE001 - launches then find it unprepared, as before
            log.exception("the executor could not get ready to launch")

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self.leader.release()
        self.platform.scheduler_role = "off"


def _end_attempt(attempt: Attempt, status: AttemptStatus, exit_code: int | None,
                 failure_class: str | None = None) -> None:
    attempt.status = status.value
    attempt.exit_code = exit_code
    attempt.ended_at = time.time()
    attempt.failure_class = failure_class
