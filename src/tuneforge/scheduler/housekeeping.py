"""Periodic housekeeping, registered in one place: each duty is a name, how often it may run
and a function. The leader's tick (scheduler/loop.py) calls `Housekeeping.run_due` once, after
admission and reconciliation; a duty that raises is logged under its name and the others still
run, so housekeeping never stops scheduling. Each duty opens and commits its own session: what
one duty wrote is kept even when the next one fails."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from tuneforge.db.repos import attempts as attempt_repo
from tuneforge.executors.protocol import Executor
from tuneforge.registry import models as registry
from tuneforge.serve import vllm
from tuneforge.services.context import Platform
from tuneforge.services.datasets import files as file_service
from tuneforge.services.datasets import processing
from tuneforge.services.datasets import uploads as upload_service
from tuneforge.services.datasets.leftovers import LeftoverSweeper
from tuneforge.services.serving import routes as route_service
from tuneforge.services.tenancy import deletion
from tuneforge.services.training import artifacts

log = logging.getLogger("tuneforge.scheduler")

# read on every pass, so a setting (e.g. the vLLM sync interval) may be a callable
Interval = float | Callable[[], float]


@dataclass(frozen=True)
class Duty:
    name: str
    interval_s: Interval  # at most once per this many seconds
    run: Callable[[], None]
    # checked before the interval: a duty that does not apply (no vLLM server configured) is
    # not counted as run, so it runs at once when it starts to apply
    applies: Callable[[], bool] = lambda: True


class Housekeeping:
    """Runs each registered duty when its interval has passed since it last ran, in the order
    registered. A duty counts as run when it starts, failed or not: a failing duty is retried
    after its interval, not on every tick."""

    def __init__(self, duties: list[Duty] | None = None, clock: Callable[[], float] = time.time) -> None:
        self._duties: list[Duty] = []
        self._last_run_at: dict[str, float] = {}
        self._clock = clock
        for duty in duties or []:
            self.register(duty)

    def register(self, duty: Duty) -> None:
        if any(known.name == duty.name for known in self._duties):
            raise ValueError(f"a housekeeping duty named {duty.name!r} is already registered")
        self._duties.append(duty)

    @property
    def names(self) -> list[str]:
        return [duty.name for duty in self._duties]

    def run_due(self) -> list[str]:
        """Run the duties that are due; the names of those that ran (failed ones included)."""
        ran: list[str] = []
        for duty in self._duties:
            try:
                if not duty.applies() or not self._due(duty):
                    continue
                ran.append(duty.name)
                duty.run()
            except Exception:  # noqa: BLE001 - housekeeping must never stop scheduling
                log.exception("housekeeping duty %s failed", duty.name)
        return ran

    def _due(self, duty: Duty) -> bool:
        now = self._clock()
        interval_s = duty.interval_s() if callable(duty.interval_s) else duty.interval_s
        last = self._last_run_at.get(duty.name)
        if last is not None and now - last < interval_s:
            return False
        self._last_run_at[duty.name] = now
        return True


def platform_duties(platform: Platform, executor: Executor) -> list[Duty]:
    """The control plane's housekeeping, in the order the tick runs it."""
    leftovers = LeftoverSweeper()  # remembers orphaned files between passes
    settings = platform.settings
    return [
        Duty("purge", 60.0, lambda: purge_deleted_models(platform)),
        Duty("expire", 60.0, lambda: expire_uploads_and_files(platform)),
        Duty("file_checks", lambda: max(1.0, settings.upload_validate_lease_s / 4),
             lambda: resume_lost_file_checks(platform)),
        Duty("failed_weights", 60.0, lambda: discard_failed_jobs_weights(platform)),
        Duty("leftovers", 3600.0, lambda: sweep_leftover_files(platform, leftovers)),
        Duty("routes", 3600.0, lambda: prune_route_requests(platform)),
        Duty("vllm", lambda: settings.vllm_sync_interval_s, lambda: sync_vllm(platform),
             applies=lambda: vllm.handoff_for(platform) is not None),
        Duty("reap", 60.0, lambda: reap_executor(platform, executor)),
        Duty("pools", 30.0, lambda: cancel_orphaned_pools(platform)),
        Duty("tenant_purge", 15.0, lambda: purge_deleted_tenants(platform)),
    ]


# ---- the duties ------------------------------------------------------------------

def cancel_orphaned_pools(platform: Platform) -> None:
    """The training API's pool jobs whose process is gone (services/training_api/scheduled.py)."""
    from tuneforge.services.training_api.scheduled import cancel_stale

    cancelled = cancel_stale(platform)
    if cancelled:
        log.info("cancelled %d co-training pool job(s) whose control plane process is gone: %s",
                 len(cancelled), ", ".join(cancelled))


def purge_deleted_tenants(platform: Platform) -> None:
    """Deleted tenants whose trainers were still stopping when they were deleted (services/tenancy/deletion.py)."""
    done = deletion.finish_pending(platform.db.session, platform.store)
    if done:
        log.info("purged the data of %d deleted tenant(s): %s", len(done), ", ".join(done))


def resume_lost_file_checks(platform: Platform) -> None:
    """Uploaded files still processing whose validation's claim has not been renewed within the
    lease (the process validating them died): validated again in this process
    (services/datasets/processing.py)."""
    processing.resume_stale(platform)


def purge_deleted_models(platform: Platform) -> None:
    """Artifacts of deleted models whose grace period is over."""
    with platform.db.session() as session:
        purged = registry.purge_expired(session, platform.store, time.time())
    if purged:
        log.info("removed the artifacts of %d deleted model(s): %s", len(purged), ", ".join(purged))


def expire_uploads_and_files(platform: Platform) -> None:
    """Pending uploads past their hour (their parts deleted) and files past `expires_at`."""
    now = time.time()
    with platform.db.session() as session:
        uploads = upload_service.expire(session, platform.store, now)
        removed = file_service.delete_expired(session, platform.store, now)
    if uploads or removed:
        log.info("expired %d upload(s) and deleted %d expired file(s)", uploads, removed)


def discard_failed_jobs_weights(platform: Platform) -> None:
    """Checkpoints and artifacts of failed jobs: not offered, so not kept (services/training/artifacts.py).
    A job counts once it has been failed for the release window, so its trainer is gone."""
    with platform.db.session() as session:
        cleared = artifacts.discard_failed(session, platform.store, time.time(),
                                           max(600.0, 2 * platform.settings.preempt_grace_s))
    if cleared:
        log.info("removed the checkpoints and artifacts of %d failed job(s)", cleared)


def sweep_leftover_files(platform: Platform, sweeper: LeftoverSweeper) -> None:
    """File objects no row owns (an upload's worker died between writing and committing),
    deleted once orphaned for the sweeper's grace period (services/datasets/leftovers.py)."""
    with platform.db.session() as session:
        removed = sweeper.sweep(session, platform.store, time.time())
    if removed:
        log.info("deleted %d leftover file(s) that no row owned", removed)


def prune_route_requests(platform: Platform) -> None:
    """Forget the requests routes served longer ago than their retention."""
    with platform.db.session() as session:
        pruned = route_service.prune(session, platform.settings.route_request_retention_days * 86_400)
    if pruned:
        log.info("forgot %d routed request(s) past their retention", pruned)


def sync_vllm(platform: Platform) -> None:
    """Every vLLM server holds the deployed adapters of its base, and no others of ours: a
    restarted server gets them back (serve/vllm.py)."""
    handoff = vllm.handoff_for(platform)
    if handoff is None:
        return
    with platform.db.session() as session:
        report = handoff.sync(session)
    if report["loaded"] or report["unloaded"]:
        log.info("vLLM: loaded %s; unloaded %s", report["loaded"], report["unloaded"])


def reap_executor(platform: Platform, executor: Executor) -> None:
    """Free what the executor still holds for attempts that ended without being released
    (a control plane that died between recording an end and releasing it)."""
    with platform.db.session() as session:
        active = {(a.job_id, a.number) for a in attempt_repo.active(session)}
    executor.reap(active)
