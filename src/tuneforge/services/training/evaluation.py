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

from tuneforge import methods
from tuneforge.db.repos import files as file_repo
from tuneforge.db.repos import tenants as tenant_repo
from tuneforge.db.tables import Job
from tuneforge.domain.errors import invalid
from tuneforge.domain.job_config import EvalConfig, JobRequest
from tuneforge.domain.resolved import ResolvedEval, ResolvedGate
from tuneforge.eval import benchmarks as benchmark_tasks
from tuneforge.eval import gates as eval_gates
from tuneforge.eval import metrics as task_metrics
from tuneforge.eval import policy as eval_policy
from tuneforge.eval import refusal
from tuneforge.eval.openai_chat import ChatEndpoint, Credentials
from tuneforge.security.crypto import Sealer
from tuneforge.security.egress import EgressPolicy
from tuneforge.services.tenancy import secrets as secret_service
from tuneforge.settings import Settings

TASK_FILE_PURPOSES = ("fine-tune", "evals")


def check_request(session: Session, settings: Settings, tenant_id: str, request: JobRequest) -> None:
    """At creation: the task file is the tenant's and usable; metrics, gates and detector parse;
    every endpoint they name passes the egress policy or is one the operator offers, and every
    secret they name exists; nothing turns off or loosens what the tenant's tier requires
    (`eval/policy.py`)."""
    config = request.eval
    tier = tenant_repo.tier_of(session, tenant_id) or ""
    eval_policy.check(settings.gate_policy_of(tier), config, tier)
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
    specs = task_metrics.parse_metrics(config.metrics)
    _check_benchmarks(settings, config.benchmarks or [])
    eval_gates.parse_gates([g.model_dump() for g in config.gates] if config.gates is not None else None)
    detector = refusal.detector_from_config(config.safety_detector)
    for param, target in _endpoints(specs, detector):
        _check_endpoint(session, settings, tenant_id, param, target)


def _check_benchmarks(settings: Settings, names: list[str]) -> None:
    """Each named task is one of the operator's and loads (its data read, its templates rendered)."""
    for index, name in enumerate(names):
        try:
            benchmark_tasks.load_named(settings.resolved_benchmark_dir, name)
        except (benchmark_tasks.BenchmarkError, OSError) as exc:
            raise invalid(f"invalid eval.benchmarks[{index}]: {exc}", param=f"eval.benchmarks[{index}]",
                          code="unknown_benchmark" if isinstance(exc, benchmark_tasks.BenchmarkError)
                          and exc.file == name else "invalid_benchmark") from None


def _endpoints(specs: list, detector: Any) -> list[tuple[str, ChatEndpoint]]:
    """The chat endpoints an eval config names, each with the field that names it."""
    found = [(f"eval.metrics[{index}]", spec.target) for index, spec in enumerate(specs)
             if isinstance(spec, task_metrics.LlmJudge)]
    if isinstance(detector, refusal.GuardModelDetector):
        found.append((refusal.PARAM, detector.target))
    return found


def _check_endpoint(session: Session, settings: Settings, tenant_id: str, param: str, target: ChatEndpoint) -> None:
    if target.endpoint_name is not None and target.endpoint_name not in settings.eval_endpoints:
        offered = ", ".join(sorted(settings.eval_endpoints)) or "none"
        raise invalid(f"{param}.endpoint_name: the platform offers no endpoint named {target.endpoint_name!r} "
                      f"(offered: {offered})", param=f"{param}.endpoint_name", code="unknown_endpoint")
    if target.endpoint is not None:
        EgressPolicy.from_settings(settings).check_url(target.endpoint, param=f"{param}.endpoint")
    if target.api_key_secret is not None:
        secret_service.require(session, tenant_id, target.api_key_secret, f"{param}.api_key_secret")


def credentials_for(session: Session, settings: Settings, sealer: Sealer, job: Job) -> Credentials:
    """What the trainer of `job` needs for its eval endpoints: the tenant's secrets its config
    names and the operator endpoints it picks — nothing else, and only the job's own tenant's."""
    config = job.resolved.eval if job.resolved is not None else None
    targets = []
    if config is not None and config.enabled:
        specs = task_metrics.parse_metrics(task_metrics.plain(config.metrics)) if config.task_file_key else []
        targets = [target for _param, target in _endpoints(specs, refusal.detector_from_config(
            task_metrics.plain(config.safety_detector)))]
    secret_names = {t.api_key_secret for t in targets if t.api_key_secret}
    endpoint_names = {t.endpoint_name for t in targets if t.endpoint_name} | _grader_judges(job, settings)
    return Credentials(
        secrets=secret_service.values(session, sealer, job.tenant_id, secret_names),
        endpoints={name: dict(settings.eval_endpoints[name]) for name in endpoint_names
                   if name in settings.eval_endpoints},
    )



def _grader_judges(job: Job, settings: Settings) -> set[str]:
    """The operator endpoint the job's grader (a reinforcement job's) reads itself: the embeddings
    endpoint when it computes cosine similarity (its judges are asked by the control plane)."""
    raw = job.resolved.hyperparameters.method_options.get("grader") if job.resolved is not None else None
    if not raw or not settings.grader_embeddings:
        return set()
    from tuneforge.eval.judges import uses_cosine
    from tuneforge.graders.check import parse

    return {settings.grader_embeddings} if uses_cosine(parse(raw, "grader")) else set()


def resolve(session: Session, settings: Settings, tenant_id: str, request: JobRequest) -> ResolvedEval:
    """What the trainer and the gate check use (`job.resolved.eval`): the request's `eval`
    (or the platform's default), the task file's storage key, the default task metrics
    and gates where the request names none."""
    config = request.eval or EvalConfig(enabled=settings.eval_by_default)
    defaults = methods.get(request.method_type).default_eval
    unset = {"golden": defaults.golden, "safety": defaults.safety}  # the method's default where the body is silent
    config = config.model_copy(update={k: v for k, v in unset.items() if k not in config.model_fields_set})
    policy = settings.gate_policy_of(tenant_repo.tier_of(session, tenant_id))
    config = config.model_copy(update=eval_policy.required_evals(policy))  # the body was checked at creation
    asked = config.model_dump(mode="json")
    task_file_key = None
    if config.task_file:
        row = file_repo.get(session, tenant_id, config.task_file)
        task_file_key = row.key if row else None
    metrics = asked["metrics"]
    if config.task_file and config.metrics is None:
        metrics = [spec_name(s) for s in task_metrics.parse_metrics(None)]
    benchmarks = tuple(config.benchmarks if config.benchmarks is not None else settings.benchmark_tasks)
    gates = [gate.as_dict() for gate in eval_gates.parse_gates(asked["gates"])] if config.gates is not None else [
        gate.as_dict() for gate in default_gates(settings, config, benchmarks)]
    gates = eval_policy.with_required_gates(policy, gates)
    return ResolvedEval(
        enabled=config.enabled, task_file=config.task_file,
        metrics=tuple(metrics) if metrics is not None else None,
        gates=tuple(ResolvedGate(**gate) for gate in gates), golden=config.golden, safety=config.safety,
        safety_detector=asked["safety_detector"], max_new_tokens=config.max_new_tokens,
        max_examples=config.max_examples, task_file_key=task_file_key, benchmarks=benchmarks,
        benchmark_dir=str(settings.resolved_benchmark_dir) if benchmarks else None,
        benchmark_batch_size=settings.benchmark_batch_size,
    )


def default_gates(settings: Settings, config: EvalConfig, benchmarks: tuple[str, ...] = ()) -> list[Any]:
    gates = eval_gates.default_gates(
        golden_max_loss_increase=settings.eval_golden_max_loss_increase,
        golden_max_accuracy_drop=settings.eval_golden_max_accuracy_drop,
        safety_max_refusal_drop=settings.eval_safety_max_refusal_drop,
    )
    skipped = {"golden": not config.golden, "safety": not config.safety}
    kept = [g for g in gates if not skipped.get(g.metric.split(".", 1)[0], False)]
    return kept + [eval_gates.regression_gate(f"{eval_gates.BENCHMARK_PREFIX}{name}",
                                              settings.benchmark_max_regression_points) for name in benchmarks]


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
