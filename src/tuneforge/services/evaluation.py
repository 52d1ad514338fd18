"""The control plane's side of post-training evaluation: the `eval` body checked
at creation, resolved (platform defaults) when the job is planned, and the
gates checked against the results the trainer reports.

The trainer measures (`train/evaluate.py`); gates, suggestions and the
decision whether a model may be promoted are made here, from the job's
resolved gates, so a trainer cannot grade itself."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from sqlalchemy.orm import Session

from tuneforge.db.repos import files as file_repo
from tuneforge.domain.errors import invalid
from tuneforge.domain.job_config import EvalConfig, JobRequest
from tuneforge.domain.resolved import ResolvedEval, ResolvedGate
from tuneforge.eval import gates as eval_gates
from tuneforge.eval import metrics as task_metrics
from tuneforge.eval import refusal
from tuneforge.settings import Settings
from tuneforge.train import methods

TASK_FILE_PURPOSES = ("fine-tune", "evals")


def check_request(session: Session, tenant_id: str, request: JobRequest) -> None:
    """At creation: the task file is the tenant's and usable; metrics, gates and detector parse."""
    config = request.eval
    if config is None:
        return
    if config.task_file:
        row = file_repo.get(session, tenant_id, config.task_file)
        if row is None:
            raise invalid(f"invalid eval.task_file: no such file {config.task_file}", param="eval.task_file",
                          code="file_not_found")
        if row.purpose not in TASK_FILE_PURPOSES:
            raise invalid(f"invalid eval.task_file: file {config.task_file} has purpose {row.purpose!r}, "
                          f"expected {' or '.join(TASK_FILE_PURPOSES)}", param="eval.task_file",
                          code="invalid_file_purpose")
        if row.status == "error":
            raise invalid(f"invalid eval.task_file {config.task_file}: {row.status_details}",
                          param="eval.task_file", code="invalid_file")
    elif config.metrics:
        raise invalid("eval.metrics score answers to eval.task_file: give a task file", param="eval.task_file")
    task_metrics.parse_metrics(config.metrics)
    eval_gates.parse_gates([g.model_dump() for g in config.gates] if config.gates is not None else None)
    refusal.detector_from_config(config.safety_detector)


def resolve(session: Session, settings: Settings, tenant_id: str, request: JobRequest) -> ResolvedEval:
    """What the trainer and the gate check use (`job.resolved.eval`): the request's `eval`
    (or the platform's default), the task file's storage key, the default task metrics
    and gates where the request names none."""
    config = request.eval or EvalConfig(enabled=settings.eval_by_default)
    defaults = methods.get(request.method_type).default_eval
    unset = {"golden": defaults.golden, "safety": defaults.safety}  # the method's default where the body is silent
    config = config.model_copy(update={k: v for k, v in unset.items() if k not in config.model_fields_set})
    asked = config.model_dump(mode="json")
    task_file_key = None
    if config.task_file:
        row = file_repo.get(session, tenant_id, config.task_file)
        task_file_key = row.key if row else None
    metrics = asked["metrics"]
    if config.task_file and config.metrics is None:
        metrics = [spec_name(s) for s in task_metrics.parse_metrics(None)]
    gates = asked["gates"] if config.gates is not None else [
        gate.as_dict() for gate in default_gates(settings, config)]
    return ResolvedEval(
        enabled=config.enabled, task_file=config.task_file,
        metrics=tuple(metrics) if metrics is not None else None,
        gates=tuple(ResolvedGate(**gate) for gate in gates), golden=config.golden, safety=config.safety,
        safety_detector=asked["safety_detector"], max_new_tokens=config.max_new_tokens,
        max_examples=config.max_examples, task_file_key=task_file_key,
    )


def default_gates(settings: Settings, config: EvalConfig) -> list[Any]:
    gates = eval_gates.default_gates(
        golden_max_loss_increase=settings.eval_golden_max_loss_increase,
        golden_max_accuracy_drop=settings.eval_golden_max_accuracy_drop,
        safety_max_refusal_drop=settings.eval_safety_max_refusal_drop,
    )
    skipped = {"golden": not config.golden, "safety": not config.safety}
    return [g for g in gates if not skipped.get(g.metric.split(".", 1)[0], False)]


def spec_name(spec: Any) -> Any:
    return getattr(spec, "name", spec)


def check_gates(resolved_eval: ResolvedEval, results: dict[str, Any],
                hyperparameters: dict[str, Any]) -> dict[str, Any]:
    """The gate report stored with the model: every gate's value and verdict, the reasons of
    the failures and concrete hyperparameter suggestions."""
    gates = eval_gates.parse_gates([asdict(gate) for gate in resolved_eval.gates])
    report = eval_gates.check(gates, results)
    suggestions = eval_gates.suggestions(report, hyperparameters) if not report.passed else []
    return {**report.as_dict(), "suggestions": suggestions}
