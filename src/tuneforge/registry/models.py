"""Registering, promoting, deprecating and purging fine-tuned models.

A model is registered once its job's trainer has written the artifacts and
the eval results are in: lineage, eval results and the gate report are stored
with it, and the SHA-256 of every artifact file, so a changed artifact is
detected (`verify_artifacts`). A model whose gates failed is registered but
cannot reach staging or production without an audited admin override. A model
that was never evaluated (its job's eval was off; a checkpoint; a training-API
checkpoint) has no gate report to override: it stays in dev, whoever asks.
Staging and production also hold a challenger to its lineage's champion
(`registry/champion.py`)."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy.orm import Session

from tuneforge.db.repos import audit as audit_repo
from tuneforge.db.repos import events
from tuneforge.db.repos import files as file_repo
from tuneforge.db.repos import jobs as job_repo
from tuneforge.db.repos import models as model_repo
from tuneforge.db.repos import routes as route_repo
from tuneforge.db.repos.audit import Entry
from tuneforge.db.tables import FineTunedModel, Job, ModelStageChange
from tuneforge.domain.errors import ApiError, invalid, not_found
from tuneforge.registry import champion, lineage
from tuneforge.registry.parents import copy_adapter_files
from tuneforge.registry.stages import GATED, STAGES, can_move
from tuneforge.storage import layout
from tuneforge.storage.store import ObjectStore


def register(session: Session, store: ObjectStore, job: Job, *, model_id: str, artifact_prefix: str,
             artifact_kind: str, attempts: int, eval_results: dict[str, Any] | None,
             gate_report: dict[str, Any] | None) -> FineTunedModel:
    training = file_repo.get(session, job.tenant_id, job.training_file)
    validation = file_repo.get(session, job.tenant_id, job.validation_file) if job.validation_file else None
    digests = lineage.artifact_digests(store, artifact_prefix)
    if gate_report is not None:
        gate_report = {**gate_report, "eval_sets": champion.eval_sets(session, job, validation)}
    row = FineTunedModel(
        model_id=model_id, tenant_id=job.tenant_id, job_id=job.job_id, base_model=job.model,
        base_model_sha256=job.base_model_sha256, artifact_prefix=artifact_prefix, created_at=int(time.time()),
        artifact_kind=artifact_kind, stage="dev",
        promotable=bool(eval_results is not None and gate_report is not None and gate_report.get("passed")),
        eval_results=eval_results, gate_report=gate_report, config_hash=job.config_hash,
        lineage=lineage.build_lineage(job, training, validation, attempts=attempts,
                                      artifact_prefix=artifact_prefix, artifact_files=digests),
    )
    if gate_report is not None and eval_results is not None:  # the champion as it is now; promotion asks again
        row.gate_report = {**gate_report, "champion": champion.compare(session, row)}
    session.add(row)
    audit_repo.append(session, Entry(actor="platform", action="model.registered", resource_type="models",
                                     resource_id=model_id, tenant_id=job.tenant_id,
                                     summary={"job_id": job.job_id, "artifact_kind": artifact_kind}))
    twin = same_config(session, job.tenant_id, job.config_hash, exclude_job=job.job_id)
    if twin is not None:
        events.add(session, job, f"{model_id} was trained with the same configuration as {twin.model_id} "
                                 f"(job {twin.job_id}): same base model, data, method, hyperparameters "
                                 "and seed", level="warn",
                   data={"code": "duplicate_config", "config_hash": job.config_hash, "same_as": twin.model_id})
    return row


def register_checkpoint(session: Session, store: ObjectStore, job: Job, *, model_id: str, step: int,
                        source_prefix: str) -> FineTunedModel:
    """A checkpoint registered as a model: its adapter copied where pruning cannot reach it. It
    was never evaluated, so it stays in dev (it serves for trying out; a job that continues it
    evaluates what it trains)."""
    target = copy_adapter_files(store, source_prefix, layout.checkpoint_model_prefix(job.tenant_id, job.job_id, step))
    training = file_repo.get(session, job.tenant_id, job.training_file)
    validation = file_repo.get(session, job.tenant_id, job.validation_file) if job.validation_file else None
    report = unevaluated_report(f"checkpoint at step {step} was not evaluated; only an evaluated model goes "
                                "beyond dev (continue it with a job that evaluates it)")
    row = FineTunedModel(
        model_id=model_id, tenant_id=job.tenant_id, job_id=job.job_id, base_model=job.model,
        base_model_sha256=job.base_model_sha256, artifact_prefix=target, created_at=int(time.time()),
        artifact_kind="adapter", stage="dev", promotable=False, eval_results=None, gate_report=report,
        config_hash=None,  # not the job's final weights: not a twin of anything
        lineage={**lineage.build_lineage(job, training, validation, attempts=job.attempt, artifact_prefix=target,
                                         artifact_files=lineage.artifact_digests(store, target)),
                 "checkpoint_step": step},
    )
    session.add(row)
    session.flush()
    return row


def register_training_checkpoint(session: Session, store: ObjectStore, *, tenant_id: str, model_id: str,
                                 base: dict[str, str], source: dict[str, Any], source_prefix: str,
                                 target_prefix: str, adapter: dict[str, Any]) -> FineTunedModel:
    """A training-API checkpoint (`source`: its run, path and time) registered as a model: its
    adapter copied to `target_prefix`, where deleting the checkpoint or its run cannot reach it.
    No job made it and nothing evaluated it: it stays in dev, as a job's checkpoint does."""
    target = copy_adapter_files(store, source_prefix, target_prefix)
    report = unevaluated_report("registered from a training-API checkpoint, which was not evaluated; only an "
                                "evaluated model goes beyond dev (continue it with a job that evaluates it)")
    row = FineTunedModel(
        model_id=model_id, tenant_id=tenant_id, job_id=None, base_model=base["name"],
        base_model_sha256=base["sha256"], artifact_prefix=target, created_at=int(time.time()),
        artifact_kind="adapter", stage="dev", promotable=False, eval_results=None, gate_report=report,
        config_hash=None,
        lineage={"base_model": dict(base), "training_run": source["run_id"], "checkpoint": source["tinker_path"],
                 "checkpoint_time": source.get("time"), "method": "training_api", "training_type": "lora",
                 "lora": dict(adapter), "job_id": None, "code_version": lineage.code_version(),
                 "artifact": {"prefix": target, "files": lineage.artifact_digests(store, target)}, "parent": None},
    )
    session.add(row)
    session.flush()
    return row


def unevaluated_report(reason: str) -> dict[str, Any]:
    """The gate report of a model nothing evaluated: failed, and marked so that no override passes it."""
    return {"passed": False, "evaluated": False, "suggestions": [],
            "gates": [{"metric": "eval", "passed": False, "reason": reason}]}


def evaluated(row: FineTunedModel) -> bool:
    """Whether the model has eval results and a gate report from them: the least a model needs to
    go beyond dev."""
    report = row.gate_report
    return row.eval_results is not None and report is not None and report.get("evaluated", True) is not False


def same_config(session: Session, tenant_id: str, config_hash: str | None, *,
                exclude_job: str | None = None) -> FineTunedModel | None:
    if not config_hash:
        return None
    return model_repo.same_config(session, tenant_id, config_hash, exclude_job)


def get(session: Session, tenant_id: str, model_id: str) -> FineTunedModel:
    row = model_repo.get(session, tenant_id, model_id)
    if row is None or row.artifacts_deleted_at is not None:
        raise model_not_found(model_id)
    return row


def model_not_found(model_id: str) -> ApiError:
    return not_found(f"The model '{model_id}' does not exist", param="model", code="model_not_found")


def get_any(session: Session, model_id: str) -> FineTunedModel:
    """A model of any tenant (operators only)."""
    row = model_repo.any_tenants(session, model_id)
    if row is None or row.artifacts_deleted_at is not None:
        raise model_not_found(model_id)
    return row


def listing(session: Session, tenant_id: str, *, base_model: str | None = None, stage: str | None = None,
            include_deprecated: bool = False) -> list[FineTunedModel]:
    if stage is not None and stage not in STAGES:
        raise invalid(f"stage must be one of {', '.join(STAGES)}", param="stage")
    return model_repo.listing(session, tenant_id, base_model=base_model, stage=stage,
                              include_deprecated=include_deprecated)


def promote(session: Session, row: FineTunedModel, target: str, *, actor: str, override: bool = False,
            reason: str | None = None) -> FineTunedModel:
    """Move a model to `target`; gated stages need passing gates or an admin override with a reason."""
    if target not in STAGES:
        raise invalid(f"stage must be one of {', '.join(STAGES)}", param="stage")
    if row.deprecated_at is not None:
        raise ApiError(409, f"{row.model_id} is deprecated (deleted); restore it first", param="model",
                       code="model_deprecated")
    if target == row.stage:
        return row
    if not can_move(row.stage, target):
        raise ApiError(409, f"{row.model_id} is in {row.stage}; it cannot move to {target} directly",
                       param="stage", code="invalid_stage_transition")
    if target == "archived":
        refuse_while_routed(session, row, "archived")
    moving_up = target in GATED and row.stage != "production"  # a step back from production is no challenge
    if moving_up and not evaluated(row):
        reasons = "; ".join(failure_reasons(row)) or "its job's eval was off"
        raise ApiError(409, f"{row.model_id} was not evaluated and cannot go beyond dev, not even with an admin "
                            f"override: {reasons}", param="stage", code="model_not_evaluated")
    if target in GATED and not row.promotable:
        if not override:
            reasons = "; ".join(failure_reasons(row)) or "its gates failed"
            raise ApiError(409, f"{row.model_id} failed its eval gates and cannot reach {target}: {reasons}",
                           param="stage", code="gates_failed")
        if not (reason and reason.strip()):
            raise invalid("an override of failed gates needs a reason", param="reason")
    behind = moving_up and not _holds_against_champion(session, row)
    if behind:
        verdict = (row.gate_report or {})["champion"]
        if not override:
            raise ApiError(409, f"{row.model_id} is worse than the production model {verdict['model']} of its "
                                f"lineage and cannot reach {target}: {verdict['reason']}", param="stage",
                           code="champion_regression")
        if not (reason and reason.strip()):
            raise invalid("an override of a regression against the production model needs a reason", param="reason")
    session.add(ModelStageChange(model_id=row.model_id, tenant_id=row.tenant_id, from_stage=row.stage,
                                 to_stage=target, actor=actor,
                                 override=bool(override and (behind or not row.promotable)),
                                 reason=reason, created_at=int(time.time())))
    row.stage = target
    return row


def _holds_against_champion(session: Session, row: FineTunedModel) -> bool:
    """Compare the model with its lineage's production model as it is now, and keep the verdict in
    its gate report (shown with the model)."""
    verdict = champion.compare(session, row)
    row.gate_report = {**(row.gate_report or {}), "champion": verdict}
    return bool(verdict["passed"])


def failure_reasons(row: FineTunedModel) -> list[str]:
    return [str(g.get("reason")) for g in (row.gate_report or {}).get("gates", []) if not g.get("passed")]


def history(session: Session, row: FineTunedModel) -> list[ModelStageChange]:
    return model_repo.stage_changes(session, row.tenant_id, row.model_id)


def deprecate(session: Session, row: FineTunedModel, *, grace_s: float, actor: str) -> FineTunedModel:
    """Deleting a model: hidden from listings at once, artifacts removed after the grace period
    (`purge_expired`); `restore` undoes it until then."""
    if row.deprecated_at is None:
        refuse_while_routed(session, row, "deleted")
        now = int(time.time())
        row.deprecated_at, row.delete_after = now, now + int(grace_s)
        session.add(ModelStageChange(model_id=row.model_id, tenant_id=row.tenant_id, from_stage=row.stage,
                                     to_stage="deprecated", actor=actor, created_at=now))
    return row


def refuse_while_routed(session: Session, row: FineTunedModel, what: str) -> None:
    """A model that a route sends traffic cannot be archived or deleted under it."""
    names = [route.name for route in route_repo.using(session, row.tenant_id, row.model_id)]
    if names:
        raise ApiError(409, f"{row.model_id} takes traffic in the route(s) {', '.join(names)}; give it weight 0 "
                            f"or remove it there before it is {what}", param="model", code="model_in_route")


def restore(session: Session, row: FineTunedModel, *, actor: str) -> FineTunedModel:
    if row.deprecated_at is None:
        raise ApiError(409, f"{row.model_id} is not deprecated", param="model", code="model_not_deprecated")
    row.deprecated_at, row.delete_after = None, None
    session.add(ModelStageChange(model_id=row.model_id, tenant_id=row.tenant_id, from_stage="deprecated",
                                 to_stage=row.stage, actor=actor, created_at=int(time.time())))
    return row


def purge_expired(session: Session, store: ObjectStore, now: float | None = None) -> list[str]:
    """Remove the artifacts of models whose grace period is over; the row stays (lineage). A full
    model that an unfinished job continues from (it reads the files in place) waits for that job."""
    now = time.time() if now is None else now
    rows = model_repo.past_grace(session, now)
    if not rows:
        return []
    unfinished = job_repo.unfinished_continuations(session)
    in_use = {(job.tenant_id, (job.parent or {}).get("model_prefix")) for job in unfinished}
    rows = [row for row in rows if (row.tenant_id, row.artifact_prefix) not in in_use]
    for row in rows:
        store.delete_prefix(row.artifact_prefix)
        row.artifacts_deleted_at = int(now)
        audit_repo.append(session, Entry(actor="platform", action="model.artifacts_deleted", resource_type="models",
                                         resource_id=row.model_id, tenant_id=row.tenant_id))
    return [row.model_id for row in rows]


def verify_artifacts(store: ObjectStore, row: FineTunedModel) -> None:
    """Raise when a registered artifact's files differ from the digests recorded at registration."""
    recorded = ((row.lineage or {}).get("artifact") or {}).get("files")
    if not recorded:
        return
    actual = lineage.artifact_digests(store, row.artifact_prefix)
    if actual != recorded:
        changed = sorted(k for k in set(actual) | set(recorded) if actual.get(k) != recorded.get(k))
        raise ApiError(409, f"the artifacts of {row.model_id} changed since registration: {', '.join(changed)}",
                       param="model", code="artifact_modified")
