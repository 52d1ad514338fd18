"""The scheduler loop: one tick validates new jobs, reconciles running
attempts with what the executor reports, and starts queued jobs in order
while there is capacity. Each phase commits on its own so a failure in one
job never blocks the others."""

from __future__ import annotations

import logging
import secrets
import threading
import time

from sqlalchemy.orm import Session

from tuneforge.db.repos import attempts as attempt_repo
from tuneforge.db.repos import jobs as job_repo
from tuneforge.db.tables import Attempt, Job
from tuneforge.domain.exit_codes import TrainerExit, describe
from tuneforge.domain.status import AttemptStatus, JobStatus
from tuneforge.executors.protocol import Executor, Placement, PollResult
from tuneforge.scheduler.spec_builder import build_spec
from tuneforge.scheduler.validation import validate_job
from tuneforge.services.context import Platform
from tuneforge.services.reports import token_hash
from tuneforge.services.transitions import transition

log = logging.getLogger("tuneforge.scheduler")
MAX_ATTEMPT_FAILURES = 3


class Scheduler:
    def __init__(self, platform: Platform, executor: Executor) -> None:
        self.platform = platform
        self.executor = executor
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- the tick -------------------------------------------------------
    def tick(self) -> None:
        self._validate_new_jobs()
        self._reconcile_attempts()
        self._admit_queued_jobs()

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
        attempt = attempt_repo.current(session, job_id, number)
        if job is None or attempt is None or attempt.status not in ("starting", "running"):
            return
        handle = attempt.handle or {}
        if job.status == JobStatus.CANCELLED.value or job.cancel_requested:
            if handle:
                self.executor.signal(handle, "cancel")
            _end_attempt(attempt, AttemptStatus.CANCELLED, None)
            return
        poll = self.executor.poll(handle) if handle else PollResult("unknown")
        if poll.state == "running":
            if time.time() - attempt.heartbeat_at > self.platform.settings.lease_timeout_s:
                self.executor.signal(handle, "cancel")
                _end_attempt(attempt, AttemptStatus.LOST, None)
                self._retry_or_fail(session, job, attempt, "lease expired: no heartbeat")
            return
        if poll.state == "unknown" and time.time() - attempt.heartbeat_at <= self.platform.settings.lease_timeout_s:
            return  # launched by another process and maybe still alive: trust the lease
        self._handle_exit(session, job, attempt, poll, handle)

    def _handle_exit(self, session: Session, job: Job, attempt: Attempt, poll: PollResult, handle: dict) -> None:
        code = poll.exit_code
        if code == TrainerExit.PREEMPTED:
            _end_attempt(attempt, AttemptStatus.PREEMPTED, code)
            transition(session, job, JobStatus.QUEUED,
                       f"Attempt {attempt.number} was preempted after a checkpoint; the job is requeued",
                       data={"code": "job_restarted", "attempt": attempt.number})
            return
        if code == TrainerExit.USER_ERROR:
            _end_attempt(attempt, AttemptStatus.FAILED, code)
            tail = self.executor.log_tail(handle, 1500)
            transition(session, job, JobStatus.FAILED, "Training failed on the data or diverged", level="error",
                       error={"code": "training_failed", "message": tail.strip()[-1000:], "param": None})
            return
        _end_attempt(attempt, AttemptStatus.FAILED if code is not None else AttemptStatus.LOST, code)
        reason = f"trainer exited: {describe(code)}" if poll.state == "exited" else poll.detail
        self._retry_or_fail(session, job, attempt, reason, handle)

    def _retry_or_fail(self, session: Session, job: Job, attempt: Attempt, reason: str,
                       handle: dict | None = None) -> None:
        failures = sum(
            1 for a in attempt_repo.for_job(session, job.job_id)
            if a.status in (AttemptStatus.FAILED.value, AttemptStatus.LOST.value)
        )
        if failures < MAX_ATTEMPT_FAILURES:
            transition(session, job, JobStatus.QUEUED,
                       f"Attempt {attempt.number} ended ({reason}); the job is requeued and resumes from its last checkpoint",
                       level="warn", data={"code": "job_restarted", "attempt": attempt.number})
            return
        tail = self.executor.log_tail(handle or attempt.handle or {}, 1500).strip()
        transition(session, job, JobStatus.FAILED, f"Fine-tuning job failed after {failures} attempts: {reason}",
                   level="error",
                   error={"code": "platform_error", "message": f"{reason}. {tail[-800:]}".strip(), "param": None})

    def _admit_queued_jobs(self) -> None:
        with self.platform.db.session() as session:
            queued = [j.job_id for j in job_repo.with_status(session, [JobStatus.QUEUED.value])]
            busy = {gpu for a in attempt_repo.active(session) for gpu in (a.placement or {}).get("gpu_ids", [])}
        total = self.executor.capacity().total_gpus
        free = [gpu for gpu in range(total) if gpu not in busy]
        for job_id in queued:
            if not free:
                return
            gpu = free.pop(0)
            try:
                self._launch(job_id, Placement("local", [gpu]))
            except Exception:  # noqa: BLE001
                log.exception("launching %s failed", job_id)

    def _launch(self, job_id: str, placement: Placement) -> None:
        token = secrets.token_urlsafe(32)
        with self.platform.db.session() as session:
            job = job_repo.get_for_update(session, job_id)
            if job is None or job.status != JobStatus.QUEUED.value:
                return
            number = job.attempt + 1
            spec = build_spec(session, self.platform.settings, job, number, token)
            job.attempt = number
            now = time.time()
            attempt = Attempt(
                job_id=job_id, number=number, status=AttemptStatus.STARTING.value, token_hash=token_hash(token),
                gpus=len(placement.gpu_ids), placement=placement.to_dict(), heartbeat_at=now, started_at=now,
            )
            session.add(attempt)
            transition(session, job, JobStatus.RUNNING, f"Fine-tuning job started (attempt {number})",
                       data={"attempt": number})
        try:
            handle = self.executor.launch(spec, placement)
        except Exception as exc:  # noqa: BLE001 - record it, requeue or fail
            with self.platform.db.session() as session:
                job = job_repo.get_for_update(session, job_id)
                attempt = attempt_repo.current(session, job_id, number)
                _end_attempt(attempt, AttemptStatus.FAILED, None)
                self._retry_or_fail(session, job, attempt, f"launch failed: {exc}")
            return
        with self.platform.db.session() as session:
            attempt = attempt_repo.current(session, job_id, number)
            attempt.handle = handle

    # ---- the thread -----------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="tuneforge-scheduler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:  # noqa: BLE001
                log.exception("scheduler tick failed")
            self._stop.wait(self.platform.settings.scheduler_tick_s)

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)


def _end_attempt(attempt: Attempt, status: AttemptStatus, exit_code: int | None) -> None:
    attempt.status = status.value
    attempt.exit_code = exit_code
    attempt.ended_at = time.time()
