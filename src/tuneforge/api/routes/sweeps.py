"""/v1/fine_tuning/sweeps — hyperparameter sweeps (an extension; services/training/sweeps.py).

A sweep runs trials of one job body over a search space, as ordinary jobs of the tenant,
stops weak trials early (ASHA) and reports the best; `POST .../promote` moves the best
trial's model to a stage like `POST /v1/models/{model}/promote`.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field

from tuneforge.api import deps
from tuneforge.api.objects import fine_tuned_model_object
from tuneforge.api.openapi import error_responses
from tuneforge.api.schemas.base import ObjectRoute
from tuneforge.api.schemas.models import Model
from tuneforge.api.schemas.sweeps import Sweep, SweepList
from tuneforge.db import Session
from tuneforge.db.tables import Tenant
from tuneforge.serve.vllm import serving_changed
from tuneforge.services.context import Platform
from tuneforge.services.training import sweeps as sweep_service
from tuneforge.services.training.sweeps import SweepView, TrialView

router = APIRouter(prefix="/v1/fine_tuning/sweeps", tags=["sweeps"], route_class=ObjectRoute)
TENANT = Depends(deps.tenant)
PLATFORM = Depends(deps.platform)


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class Objective(_Body):
    metric: str = Field("validation.loss", max_length=128,
                        description="validation.loss, or eval.<metric> (a result of the trial's post-training eval).")
    goal: Literal["minimize", "maximize"] = "minimize"


class EarlyStopping(_Body):
    type: Literal["asha"] = "asha"
    min_epochs: float = Field(1.0, gt=0, le=1000, description="The first rung: trials are first judged here.")
    eta: int = Field(3, ge=2, le=10, description="Each rung keeps the best 1/eta; the next is eta times further.")


class SweepCreate(_Body):
    job: dict[str, Any] = Field(description="A fine-tuning job body, as POST /v1/fine_tuning/jobs takes it.")
    search_space: dict[str, Any] = Field(description='Parameters and their values, e.g. {"learning_rate": '
                                                     '{"type": "loguniform", "low": 1e-4, "high": 1e-2}}.')
    sampler: Literal["grid", "random", "tpe"] | None = Field(
        None, description="grid (default when every parameter is a choice), random, or tpe (Optuna's TPE).")
    max_trials: int | None = Field(None, ge=1, le=sweep_service.MAX_TRIALS)
    max_parallel: int | None = Field(None, ge=1, le=sweep_service.MAX_TRIALS)
    objective: Objective | None = None
    early_stopping: EarlyStopping | None = None
    seed: int | None = Field(None, ge=0, le=2**31 - 1)


class PromoteBest(_Body):
    stage: Literal["dev", "staging", "production", "archived"] = "staging"


def _trial_object(shown: TrialView) -> dict[str, Any]:
    trial = shown.trial
    return {"number": trial.number, "job_id": trial.job_id, "params": trial.params, "status": trial.status,
            "rungs": trial.rungs, "objective": trial.objective, "fine_tuned_model": shown.fine_tuned_model,
            "gpu_seconds": round(shown.gpu_seconds, 3)}


def sweep_object(view: SweepView) -> dict[str, Any]:
    sweep = view.sweep
    shown = [_trial_object(trial) for trial in view.trials]
    best = next((t for t in shown if t["job_id"] == sweep.best_job_id), None) if sweep.best_job_id else None
    config = sweep.config
    return {"id": sweep.sweep_id, "object": "fine_tuning.sweep", "status": sweep.status,
            "created_at": sweep.created_at, "finished_at": sweep.finished_at, "error": sweep.error,
            "sampler": config["sampler"], "max_trials": config["max_trials"], "max_parallel": config["max_parallel"],
            "objective": config["objective"], "early_stopping": config["early_stopping"],
            "search_space": config["search_space"], "seed": config["seed"],
            "trials": shown, "best_trial": best,
            "stopped_early": sum(t["status"] == "stopped" for t in shown),
            "gpu_seconds": round(sum(t["gpu_seconds"] for t in shown), 3)}


@router.post("", response_model=Sweep, responses=error_responses(403, 429))
def create_sweep(body: SweepCreate, tenant: Tenant = TENANT, session: Session = deps.SESSION,
                 platform: Platform = PLATFORM) -> dict:
    return sweep_object(sweep_service.create(session, platform, tenant, body.model_dump(exclude_none=True)))


@router.get("", response_model=SweepList)
def list_sweeps(tenant: Tenant = TENANT, session: Session = deps.SESSION) -> dict:
    return {"object": "list", "has_more": False,
            "data": [sweep_object(view) for view in sweep_service.listing(session, tenant.tenant_id)]}


@router.get("/{sweep_id}", response_model=Sweep)
def retrieve_sweep(sweep_id: str, tenant: Tenant = TENANT, session: Session = deps.SESSION) -> dict:
    return sweep_object(sweep_service.retrieve(session, tenant.tenant_id, sweep_id))


@router.post("/{sweep_id}/cancel", response_model=Sweep)
def cancel_sweep(sweep_id: str, tenant: Tenant = TENANT, session: Session = deps.SESSION,
                 platform: Platform = PLATFORM) -> dict:
    return sweep_object(sweep_service.cancel(session, platform, tenant.tenant_id, sweep_id))


@router.post("/{sweep_id}/promote", response_model=Model, responses=error_responses(409))
def promote_best(sweep_id: str, body: PromoteBest | None = None, tenant: Tenant = TENANT,
                 session: Session = deps.SESSION, platform: Platform = PLATFORM) -> dict:
    """Move the best trial's model to a stage (default staging), as POST /v1/models/{model}/promote does."""
    model = sweep_service.promote_best(session, tenant.tenant_id, sweep_id, (body or PromoteBest()).stage)
    session.commit()  # stored before the vLLM servers are brought in line
    serving_changed(platform, session)
    return fine_tuned_model_object(model)
