"""Hyperparameter sweeps: trials are ordinary jobs of the tenant (same quotas, priorities,
metering and lineage), created and judged by the scheduler (`advance`, every tick of the
leader), so a sweep survives control-plane restarts: its whole state is in the database.

A sweep is a base job body, a search space (`sweeps/space.py`), a sampler, `max_trials` and
`max_parallel`, an objective and, optionally, ASHA early stopping (`sweeps/asha.py`) on the
objective measured at epoch checkpoints. The objective is `validation.loss` (the validation
loss at each epoch's checkpoint; the final one decides) or `eval.<metric>` (the trial model's
eval result, known once it finished; no early stopping on it). Cancelling a sweep cancels its
running trials; the best trial's model can be promoted like any model.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from sqlalchemy.orm import Session

from tuneforge.db.repos import attempts as attempt_repo
from tuneforge.db.repos import checkpoints as checkpoint_repo
from tuneforge.db.repos import events
from tuneforge.db.repos import jobs as job_repo
from tuneforge.db.repos import models as model_repo
from tuneforge.db.repos import sweeps as sweep_repo
from tuneforge.db.repos import tenants as tenant_repo
from tuneforge.db.tables import FineTunedModel, Job, Sweep, SweepTrial, Tenant
from tuneforge.domain.errors import ApiError, invalid, not_found
from tuneforge.domain.ids import new_id
from tuneforge.domain.job_config import JobRequest
from tuneforge.domain.status import JobStatus
from tuneforge.registry import models as registry
from tuneforge.services.context import Platform
from tuneforge.services.tenancy import usage
from tuneforge.services.training import jobs as job_service
from tuneforge.sweeps import space as sweep_space
from tuneforge.sweeps.asha import Asha, judge

log = logging.getLogger(__name__)

MAX_TRIALS = 100
MAX_KEPT = 100  # checkpointing.keep_last's bound
VALIDATION_LOSS = "validation.loss"
ACTIVE_TRIAL = ("pending", "running")
TERMINAL = ("succeeded", "failed", "cancelled")


# ---- the request ------------------------------------------------------------------

def check_config(session: Session, platform: Platform, tenant: Tenant, body: Mapping[str, Any]) -> dict[str, Any]:
    """The sweep request as stored, or 400 naming the field. The first trial's job body is
    checked as a job create would check it, so a sweep that could never run is refused now."""
    job = body.get("job")
    if not isinstance(job, Mapping):
        raise invalid("job must be a fine-tuning job body", param="job")
    dims = sweep_space.parse_space(body.get("search_space"))
    sampler = body.get("sampler") or ("grid" if all(d.kind == "choice" for d in dims) else "random")
    sweep_space.check_sampler(sampler, dims)
    max_trials = int(body.get("max_trials") or (sweep_space.grid_size(dims) if sampler == "grid" else 10))
    if not 1 <= max_trials <= MAX_TRIALS:
        raise invalid(f"max_trials must be between 1 and {MAX_TRIALS}", param="max_trials")
    if sampler == "grid":
        max_trials = min(max_trials, sweep_space.grid_size(dims))
    max_parallel = int(body.get("max_parallel") or min(max_trials, 4))
    if not 1 <= max_parallel <= max_trials:
        raise invalid("max_parallel must be between 1 and max_trials", param="max_parallel")
    objective = dict(body.get("objective") or {"metric": VALIDATION_LOSS, "goal": "minimize"})
    metric, goal = objective.get("metric"), objective.get("goal", "minimize")
    if not isinstance(metric, str) or not (metric == VALIDATION_LOSS or (
            metric.startswith("eval.") and len(metric) > len("eval."))):
        raise invalid(f"objective.metric must be {VALIDATION_LOSS!r} or 'eval.<metric>'", param="objective.metric")
    if goal not in ("minimize", "maximize"):
        raise invalid("objective.goal must be minimize or maximize", param="objective.goal")
    stopping = body.get("early_stopping")
    if stopping is not None:
        if not isinstance(stopping, Mapping) or stopping.get("type") != "asha":
            raise invalid('early_stopping must be {"type": "asha", "min_epochs": 1, "eta": 3} or null',
                          param="early_stopping")
        if metric != VALIDATION_LOSS:
            raise invalid("early stopping judges trials on validation.loss at their checkpoints; an eval metric "
                          "is known only once a trial has finished", param="early_stopping")
        min_epochs, eta = stopping.get("min_epochs", 1), stopping.get("eta", 3)
        if not isinstance(min_epochs, (int, float)) or min_epochs <= 0 or not isinstance(eta, int) or eta < 2:
            raise invalid("early_stopping: min_epochs > 0 and an integer eta >= 2", param="early_stopping")
        stopping = {"type": "asha", "min_epochs": float(min_epochs), "eta": eta}
    seed = body.get("seed")
    seed = int(seed) if isinstance(seed, int) and not isinstance(seed, bool) else 0
    request = _request(job, _method_type(job), _first_point(dims, sampler, seed), every_epoch=stopping is not None)
    job_service.check_inputs(session, platform.settings, tenant, request, platform.store)
    if metric == VALIDATION_LOSS and not (request.validation_file or (request.data and request.data.validation_split)):
        raise invalid("objective validation.loss needs validation data: job.validation_file or "
                      "job.data.validation_split", param="job.validation_file")
    return {"job": dict(job), "search_space": body.get("search_space"), "sampler": sampler,
            "max_trials": max_trials, "max_parallel": max_parallel,
            "objective": {"metric": metric, "goal": goal}, "early_stopping": stopping, "seed": seed}


def _epochs(body: Mapping[str, Any]) -> int:
    """The trial's epochs when its body sets them, else the most a job may have: every epoch's
    checkpoint is kept, so that each rung has its measurement."""
    method = body.get("method") if isinstance(body.get("method"), Mapping) else {}
    section = method.get(str(method.get("type") or "supervised")) if isinstance(method, Mapping) else None
    hyperparameters = (section or {}).get("hyperparameters") if isinstance(section, Mapping) else None
    epochs = (hyperparameters or {}).get("n_epochs") if isinstance(hyperparameters, Mapping) else None
    return max(1, min(int(epochs), MAX_KEPT)) if isinstance(epochs, int) and not isinstance(epochs, bool) \
        else MAX_KEPT


def _method_type(job: Mapping[str, Any]) -> str:
    method = job.get("method")
    return str(method.get("type") or "supervised") if isinstance(method, Mapping) else "supervised"


def _first_point(dims: list[sweep_space.Dimension], sampler: str, seed: int) -> dict[str, Any]:
    return sweep_space.grid_point(dims, 0, seed) if sampler == "grid" else sweep_space.random_point(dims, seed, 0)


def _request(job: Mapping[str, Any], method_type: str, params: Mapping[str, Any], *,
             every_epoch: bool = False) -> JobRequest:
    body = sweep_space.apply(job, method_type, params)
    if every_epoch:  # early stopping reads the validation loss at epoch ends: each one needs its checkpoint
        checkpointing = dict(body.get("checkpointing") or {})
        checkpointing.setdefault("every_epoch", True)
        checkpointing.setdefault("keep_last", _epochs(body))
        body["checkpointing"] = checkpointing
    try:
        return JobRequest.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = "job." + ".".join(str(part) for part in first["loc"])
        raise invalid(f"{where}: {first['msg']} (with the parameters {dict(params)})", param=where) from None


# ---- the API's operations ---------------------------------------------------------

@dataclass(frozen=True)
class TrialView:
    """A trial as the API shows it: its row, its job's model (once trained) and its GPU time."""
    trial: SweepTrial
    fine_tuned_model: str | None
    gpu_seconds: float


@dataclass(frozen=True)
class SweepView:
    sweep: Sweep
    trials: list[TrialView]


def create(session: Session, platform: Platform, tenant: Tenant, body: Mapping[str, Any]) -> SweepView:
    config = check_config(session, platform, tenant, body)
    sweep = Sweep(sweep_id=new_id("sweep"), tenant_id=tenant.tenant_id, status="running", config=config,
                  created_at=int(time.time()))
    session.add(sweep)
    session.flush()
    return view(session, sweep)


def get(session: Session, tenant_id: str, sweep_id: str) -> Sweep:
    sweep = sweep_repo.get(session, tenant_id, sweep_id)
    if sweep is None:
        raise not_found(f"No sweep with id {sweep_id}", param="sweep_id", code="sweep_not_found")
    return sweep


def retrieve(session: Session, tenant_id: str, sweep_id: str) -> SweepView:
    return view(session, get(session, tenant_id, sweep_id))


def listing(session: Session, tenant_id: str, limit: int = 100) -> list[SweepView]:
    return [view(session, sweep) for sweep in sweep_repo.of_tenant(session, tenant_id, limit)]


def trials(session: Session, sweep: Sweep) -> list[SweepTrial]:
    return sweep_repo.trials(session, sweep.tenant_id, sweep.sweep_id)


def view(session: Session, sweep: Sweep) -> SweepView:
    """The sweep with each trial's model and GPU seconds (every attempt of its job, so far)."""
    rows = trials(session, sweep)
    job_ids = [t.job_id for t in rows if t.job_id]
    jobs = job_repo.get_many(session, sweep.tenant_id, job_ids)
    seconds: dict[str, float] = {}
    now = time.time()
    for attempt in attempt_repo.for_jobs(session, sweep.tenant_id, job_ids):
        seconds[attempt.job_id] = seconds.get(attempt.job_id, 0.0) + usage.gpu_seconds(attempt, now)
    shown = []
    for trial in rows:
        job = jobs.get(trial.job_id or "")
        shown.append(TrialView(trial, job.fine_tuned_model if job is not None else None,
                               seconds.get(trial.job_id or "", 0.0)))
    return SweepView(sweep, shown)


def cancel(session: Session, platform: Platform, tenant_id: str, sweep_id: str) -> SweepView:
    sweep = get(session, tenant_id, sweep_id)
    if sweep.status in TERMINAL:
        raise ApiError(400, f"Sweep {sweep_id} has already {sweep.status}", param="sweep_id",
                       code="sweep_not_cancellable")
    for trial in trials(session, sweep):
        if trial.status in ACTIVE_TRIAL:
            _stop(session, platform, sweep, trial, "cancelled", "Cancelled with its sweep")
    sweep.status, sweep.finished_at = "cancelled", int(time.time())
    return view(session, sweep)


def promote_best(session: Session, tenant_id: str, sweep_id: str, stage: str) -> FineTunedModel:
    """Move the best trial's model to `stage`, as promoting the model itself does; 409 while the
    sweep has no best trial, or when that trial registered no model."""
    sweep = get(session, tenant_id, sweep_id)
    if sweep.status != "succeeded" or not sweep.best_job_id:
        raise ApiError(409, f"Sweep {sweep_id} has no best trial yet (it is {sweep.status})", param="sweep_id",
                       code="sweep_not_finished")
    model = model_repo.of_job(session, tenant_id, sweep.best_job_id)
    if model is None:
        raise ApiError(409, "The best trial registered no model", param="sweep_id", code="model_not_found")
    registry.promote(session, model, stage, actor=f"tenant:{tenant_id}")
    return model


# ---- the controller (the scheduler runs it) -----------------------------------------

def advance(platform: Platform) -> None:
    """One pass over every running sweep: follow its trials, stop the weak ones, start new ones,
    finish it when all are done. A sweep that breaks is failed, not retried forever."""
    with platform.db.session() as session:
        running = sweep_repo.running_ids(session)
    for sweep_id in running:
        try:
            with platform.db.session() as session:
                sweep = sweep_repo.get_for_update(session, sweep_id)
                if sweep is not None and sweep.status == "running":
                    _advance_one(session, platform, sweep)
        except Exception:  # noqa: BLE001 - one broken sweep must not stop the others
            log.exception("advancing sweep %s failed", sweep_id)


def _advance_one(session: Session, platform: Platform, sweep: Sweep) -> None:
    config = sweep.config
    minimize = config["objective"]["goal"] == "minimize"
    stopping = config.get("early_stopping")
    asha = Asha(stopping["min_epochs"], stopping["eta"], minimize) if stopping else None
    rows = trials(session, sweep)
    jobs = job_repo.get_many(session, sweep.tenant_id, [t.job_id for t in rows if t.job_id])
    records: dict[int, list[float]] = {}
    for trial in rows:
        for index, value in enumerate(trial.rungs or []):
            records.setdefault(index, []).append(value)
    for trial in rows:
        job = jobs.get(trial.job_id or "")
        if trial.status == "running" and job is not None:
            _follow(session, platform, sweep, trial, job, asha, records)
    _start_trials(session, platform, sweep, rows)
    if sweep.status == "failed":  # a trial the platform refused: the others stop too
        for trial in rows:
            if trial.status in ACTIVE_TRIAL:
                _stop(session, platform, sweep, trial, "cancelled", f"Cancelled: sweep {sweep.sweep_id} failed")
    elif all(t.status not in ACTIVE_TRIAL for t in rows) and len(rows) >= config["max_trials"]:
        _finish(sweep, rows, minimize)


def _follow(session: Session, platform: Platform, sweep: Sweep, trial: SweepTrial, job: Job, asha: Asha | None,
            records: dict[int, list[float]]) -> None:
    metric = sweep.config["objective"]["metric"]
    if job.status == JobStatus.SUCCEEDED.value:
        trial.objective = _final_objective(session, sweep.tenant_id, job, metric)
        trial.status = "completed" if trial.objective is not None else "failed"
        return
    if job.status in (JobStatus.FAILED.value, JobStatus.CANCELLED.value):
        trial.status = "failed" if job.status == JobStatus.FAILED.value else "cancelled"
        return
    if asha is None or job.resolved is None:
        return
    n_epochs = float(job.resolved.hyperparameters.n_epochs)
    points = _epoch_losses(session, sweep.tenant_id, job.job_id)
    others = {index: [v for v in values] for index, values in records.items()}
    for index, value in enumerate(trial.rungs or []):  # its own values are not its competitors
        others[index].remove(value)
    new, goes_on = judge(asha, n_epochs, points, len(trial.rungs or []), others)
    if new:
        trial.rungs = [*(trial.rungs or []), *(value for _index, value in new)]
        for index, value in new:
            records.setdefault(index, []).append(value)
    if not goes_on:
        index, value = new[-1]
        rung = asha.rungs(n_epochs)[index]
        trial.objective = value
        _stop(session, platform, sweep, trial, "stopped",
              f"Stopped early by sweep {sweep.sweep_id}: validation loss {value:.4g} at epoch {rung:g} is not among "
              f"the best 1/{asha.eta} of the {len(records[index])} trials that reached it")


def _epoch_losses(session: Session, tenant_id: str, job_id: str) -> list[tuple[float, float]]:
    rows = checkpoint_repo.epoch_metrics(session, tenant_id, job_id)
    return [(float(epoch), float(metrics["valid_loss"])) for epoch, metrics in rows
            if isinstance((metrics or {}).get("valid_loss"), (int, float))]


def _final_objective(session: Session, tenant_id: str, job: Job, metric: str) -> float | None:
    if metric == VALIDATION_LOSS:
        points = _epoch_losses(session, tenant_id, job.job_id)
        return points[-1][1] if points else None
    model = model_repo.of_job(session, tenant_id, job.job_id)
    value = ((model.eval_results or {}) if model is not None else {}).get(metric[len("eval."):])
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _stop(session: Session, platform: Platform, sweep: Sweep, trial: SweepTrial, status: str, message: str) -> None:
    trial.status = status
    if not trial.job_id:
        return
    job = job_repo.get(session, sweep.tenant_id, trial.job_id)
    if job is None or job.status in (JobStatus.SUCCEEDED.value, JobStatus.FAILED.value, JobStatus.CANCELLED.value):
        return
    events.add(session, job, message, level="warn", data={"code": "sweep_stopped", "sweep_trial": trial.number})
    job_service.cancel_job(session, job.tenant_id, job.job_id, platform.store)


def _start_trials(session: Session, platform: Platform, sweep: Sweep, rows: list[SweepTrial]) -> None:
    config = sweep.config
    tenant = tenant_repo.by_id(session, sweep.tenant_id)
    if tenant is None:
        return
    dims = sweep_space.parse_space(config["search_space"])
    minimize = config["objective"]["goal"] == "minimize"
    while len(rows) < config["max_trials"] and sum(t.status in ACTIVE_TRIAL for t in rows) < config["max_parallel"]:
        number = len(rows)
        params = _suggest(config, dims, number, rows, minimize)
        request = _request(config["job"], _method_type(config["job"]), params,
                           every_epoch=bool(config.get("early_stopping")))
        metadata = {**(request.metadata or {}), "sweep_id": sweep.sweep_id, "sweep_trial": str(number)}
        request = request.model_copy(update={"metadata": dict(list(metadata.items())[-16:])})
        try:  # the scheduler validates it like any new job; the key makes a retried pass find the same job
            job, _created = job_service.create_job(session, platform.settings, tenant, request,
                                                   idempotency_key=f"{sweep.sweep_id}:trial-{number}",
                                                   store=platform.store)
        except ApiError as exc:
            if exc.status_code in (403, 429):  # a quota: the trial waits for room, like any job would
                return
            _fail(sweep, {"code": exc.code or "trial_refused", "message": exc.message, "param": exc.param})
            return
        trial = SweepTrial(sweep_id=sweep.sweep_id, number=number, job_id=job.job_id, params=params,
                           status="running", rungs=[], created_at=int(time.time()))
        session.add(trial)
        rows.append(trial)
        events.add(session, job, f"Trial {number} of sweep {sweep.sweep_id}: {params}",
                   data={"code": "sweep_trial", "sweep_id": sweep.sweep_id, "params": params})


def _suggest(config: Mapping[str, Any], dims: list[sweep_space.Dimension], number: int, rows: list[SweepTrial],
             minimize: bool) -> dict[str, Any]:
    sampler, seed = config["sampler"], config["seed"]
    if sampler == "grid":
        return sweep_space.grid_point(dims, number, seed)
    if sampler == "tpe":
        finished = [(t.params, t.objective) for t in rows if t.status == "completed" and t.objective is not None]
        return sweep_space.tpe_point(dims, seed, number, minimize=minimize, finished=finished)
    return sweep_space.random_point(dims, seed, number)


def _finish(sweep: Sweep, rows: list[SweepTrial], minimize: bool) -> None:
    completed = [t for t in rows if t.status == "completed" and t.objective is not None]
    if not completed:
        _fail(sweep, {"code": "no_trial_completed", "message": "no trial finished with an objective value",
                      "param": None})
        return
    best = (min if minimize else max)(completed, key=lambda t: (t.objective, t.number))
    sweep.best_job_id, sweep.status, sweep.finished_at = best.job_id, "succeeded", int(time.time())


def _fail(sweep: Sweep, error: dict[str, Any]) -> None:
    sweep.status, sweep.error, sweep.finished_at = "failed", error, int(time.time())
