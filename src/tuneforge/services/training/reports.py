"""Reports from trainer attempts: heartbeats, events, checkpoints, results.

Fencing: a report is applied only if it comes from the job's current attempt
with that attempt's token; anything else answers 409 `stale_attempt`, so a
zombie trainer can never overwrite state. Reports carry an increasing `seq`
per attempt and are delivered in order, so `seq <= attempts.last_seq` means
"already applied" and a retried report is acknowledged without effect.

Refusals: a report of the current attempt that cannot be applied (its type
refuses it, or it names something it must not) is answered 4xx once and logged
here with its reason under an error id (`refused`); the trainer logs the same
answer, sends a `report_refused` failure and exits, and the job fails without
a retry (`fail`): the same report would be refused again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import asdict
from typing import Any

from sqlalchemy.orm import Session

from tuneforge import prometheus
from tuneforge.db.repos import attempts as attempt_repo
from tuneforge.db.repos import checkpoints as checkpoint_repo
from tuneforge.db.repos import events
from tuneforge.db.repos import jobs as job_repo
from tuneforge.db.repos import tenants as tenant_repo
from tuneforge.db.tables import Attempt, Checkpoint, Job
from tuneforge.domain import reports, retention
from tuneforge.domain.errors import ApiError, invalid, unauthorized
from tuneforge.domain.ids import correlation_id, new_id
from tuneforge.domain.metrics import checkpoint_metrics, metrics_data, metrics_message
from tuneforge.domain.status import ATTEMPT_ACTIVE, AttemptStatus, JobStatus
from tuneforge.domain.tenant_text import scrub, scrub_data
from tuneforge.registry import models as registry
from tuneforge.registry import parents
from tuneforge.services.datasets import files as file_service
from tuneforge.services.training import evaluation, integrations
from tuneforge.services.training.transitions import transition
from tuneforge.storage import layout
from tuneforge.storage.store import ObjectStore

log = logging.getLogger(__name__)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _stale(message: str) -> ApiError:
    return ApiError(409, message, "invalid_request_error", "attempt", "stale_attempt")


def authorize(session: Session, job_id: str, number: int, authorization: str | None) -> tuple[Job, Attempt]:
    token = (authorization or "").partition(" ")[2].strip()
    job = job_repo.get_for_update(session, job_id)
    attempt = attempt_repo.current(session, job.tenant_id, job.job_id, number) if job else None
    if job is None or attempt is None or attempt.token_hash != token_hash(token):
        raise unauthorized("invalid job token", code="invalid_job_token")
    return job, attempt


def require_current(job: Job, attempt: Attempt) -> None:
    """409 `stale_attempt` unless `attempt` is its running (or evaluating) job's current one: what
    every request of a trainer's is held to (reports, credentials, judges, objects)."""
    if attempt.number != job.attempt or AttemptStatus(attempt.status) not in ATTEMPT_ACTIVE:
        raise _stale(f"attempt {attempt.number} of {job.job_id} is no longer current")
    if job.status not in (JobStatus.RUNNING.value, JobStatus.EVALUATING.value):
        raise _stale(f"{job.job_id} is {job.status}")


def credentials(session: Session, platform: Any, job: Job, attempt: Attempt) -> dict:
    """The credentials the current attempt needs: its eval's (its tenant's secrets and the operator's
    endpoints its config names) and its trackers' (`tracking`, services/training/integrations.py); a stale
    attempt gets 409 like its reports."""
    require_current(job, attempt)
    found = evaluation.credentials_for(session, platform.settings, platform.sealer, job)
    return {"secrets": dict(found.secrets), "endpoints": {k: dict(v) for k, v in found.endpoints.items()},
            "tracking": integrations.access_for(session, platform.settings, platform.sealer, job)}


MAX_JUDGED = 512  # conversations in one judge request
MAX_JUDGED_CHARS = 262_144  # of one message
_JUDGED_ROLES = ("system", "developer", "user", "assistant")


def judge(session: Session, platform: Any, job: Job, attempt: Attempt, body: Any) -> dict:
    """The answers the judge of the job's model grader `grader` (a sub-grader's name) gives the
    current attempt's conversations: who judges, and with what sampling, is the job's grader's
    (services/serving/judges.py), never the trainer's; the tokens are metered to the job."""
    from tuneforge.domain.graders import judges
    from tuneforge.graders.check import parse
    from tuneforge.graders.score import JudgeError, judge_schema
    from tuneforge.services.serving.judges import TenantJudges

    require_current(job, attempt)
    raw = job.resolved.hyperparameters.method_options.get("grader") if job.resolved is not None else None
    name = body.get("grader") if isinstance(body, dict) else None
    grader = judges(parse(raw, "grader")).get(name) if raw and isinstance(name, str) else None
    if grader is None:
        raise invalid("grader must name one of the job's model graders", param="grader")
    conversations = _conversations(body.get("conversations"))
    tenant = tenant_repo.by_id(session, job.tenant_id)
    tier, tenant_name, job_id = (tenant.tier if tenant else "default"), (tenant.name if tenant else ""), job.job_id
    session.commit()  # the job's row is not held while the judge answers
    sampling = grader.sampling_params.model_dump(exclude_none=True) if grader.sampling_params else {}
    replies = TenantJudges(platform, job.tenant_id, tier, tenant_name=tenant_name, job_id=job_id).complete_many(
        grader, conversations, sampling=sampling, schema=judge_schema(grader))
    return {"replies": [{"error": str(reply)} if isinstance(reply, JudgeError) else
                        {"text": reply.text, "tokens": reply.tokens, "completion_tokens": reply.completion_tokens,
                         "refused": reply.refused} for reply in replies]}


def _conversations(raw: Any) -> list[list[dict[str, str]]]:
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_JUDGED:
        raise invalid(f"conversations must be a list of 1 to {MAX_JUDGED} conversations", param="conversations")
    checked = []
    for index, conversation in enumerate(raw):
        if not isinstance(conversation, list) or not 1 <= len(conversation) <= 64 or not all(
                isinstance(m, dict) and m.get("role") in _JUDGED_ROLES and isinstance(m.get("content"), str)
                and len(m["content"]) <= MAX_JUDGED_CHARS for m in conversation):
            raise invalid(f"conversations[{index}] must be 1 to 64 messages of a role and a text of at most "
                          f"{MAX_JUDGED_CHARS} characters", param=f"conversations[{index}]")
        checked.append([{"role": m["role"], "content": m["content"]} for m in conversation])
    return checked


def refused(job: Job, attempt: Attempt, kind: str, error: ApiError) -> ApiError:
    """`error` (a 4xx refusing a report of the current attempt) logged for the operator with its
    reason under a new error id, and the same error naming that id for the trainer's log."""
    error_id = correlation_id("err")
    log.warning("refused the %s report of %s attempt %d [%s]: HTTP %d %s", kind, job.job_id, attempt.number,
                error_id, error.status_code, error.message)
    return ApiError(error.status_code, f"{error.message} (error id {error_id})", error.type, error.param,
                    error.code or "invalid_report", error.retry_after)


def _already_applied(attempt: Attempt, seq: int) -> bool:
    return seq <= attempt.last_seq


def apply(session: Session, store: ObjectStore, job: Job, attempt: Attempt, message: reports.Report) -> dict:
    """Act on one authorized report; the answer the trainer gets."""
    if isinstance(message, reports.Heartbeat):
        return heartbeat(session, job, attempt, message)
    if isinstance(message, reports.Events):
        return {"applied": add_events(session, job, attempt, message)}
    if isinstance(message, reports.Resumed):
        return {"recovered_steps": resumed(session, store, job, attempt, message)}
    if isinstance(message, reports.CheckpointWritten):
        add_checkpoint(session, job, attempt, message)
    elif isinstance(message, reports.Evaluating):
        evaluating(session, job, attempt, message)
    elif isinstance(message, reports.Result):
        complete(session, store, job, attempt, message)
    else:
        fail(session, job, attempt, message)
    return {"ok": True}


def heartbeat(session: Session, job: Job, attempt: Attempt, body: reports.Heartbeat) -> dict[str, str]:
    if job.cancel_requested or job.status == JobStatus.CANCELLED.value:
        return {"action": "stop"}
    require_current(job, attempt)
    now = time.time()
    attempt.heartbeat_at = now
    if attempt.status == AttemptStatus.STARTING.value:
        attempt.status = AttemptStatus.RUNNING.value
    step, total = body.step, body.total_steps
    attempt.step = step
    if total:
        attempt.total_steps = total
        done = step - (body.start_step or 0)
        if done > 0:
            seconds_per_step = (now - attempt.started_at) / done
            job.estimated_finish = int(now + seconds_per_step * (total - step))
    return {"action": "continue"}


def add_events(session: Session, job: Job, attempt: Attempt, body: reports.Events) -> int:
    require_current(job, attempt)
    applied = 0
    for item in sorted(body.events, key=lambda e: e.seq):
        if _already_applied(attempt, item.seq):
            continue
        events.add(
            session, job, scrub(item.message), level=item.level, event_type=item.type,
            data=scrub_data(item.data), attempt=attempt.number, seq=item.seq,
            created_at=int(item.created_at or time.time()),
        )
        attempt.last_seq = item.seq
        attempt.heartbeat_at = time.time()
        if item.type == "metrics":
            step = item.data.get("step")  # free-form data: a step that is not a count is not a 500
            attempt.step = step if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else attempt.step
            prometheus.count_trainer_steps(1)  # a trainer reports every optimizer step it takes
            prometheus.observe_gpu(item.data)  # what NVML said of its GPU, when it said anything
        applied += 1
    return applied


def add_checkpoint(session: Session, job: Job, attempt: Attempt, body: reports.CheckpointWritten) -> None:
    require_current(job, attempt)
    seq = body.seq
    if _already_applied(attempt, seq):
        return
    step = body.step
    metrics = {"step": float(step), **body.metrics}
    row = checkpoint_repo.at_step(session, job.tenant_id, job.job_id, step)
    if row is None:
        row = Checkpoint(
            checkpoint_id=new_id("ftckpt"), job_id=job.job_id, step=step, attempt=attempt.number,
            prefix=body.prefix, metrics=metrics, created_at=int(time.time()), epoch=body.epoch,
        )
        session.add(row)
    else:  # an exact resume may write the same step again
        row.prefix, row.metrics, row.attempt, row.epoch = body.prefix, metrics, attempt.number, body.epoch
    events.add(session, job, f"Checkpoint created at step {step}",
               data={"step": step, "checkpoint": row.checkpoint_id}, attempt=attempt.number, seq=seq)
    attempt.last_seq = seq
    _forget_pruned(session, job, step)


def resumed(session: Session, store: ObjectStore, job: Job, attempt: Attempt, body: reports.Resumed) -> int:
    """An attempt resumed from the checkpoint at `step`. Reports of the attempt that
    wrote it may have died with that trainer (queued while the control plane was
    away, then SIGKILLed): the checkpoint's own history fills in every step up to
    `step` that has no metrics event, and the checkpoint is listed if it is not.
    Returns how many steps' metrics were recovered."""
    require_current(job, attempt)
    seq = body.seq
    if _already_applied(attempt, seq):
        return 0
    attempt.last_seq = seq
    step, prefix = body.step, body.prefix
    if prefix != layout.checkpoint_prefix(job.tenant_id, job.job_id, step):
        raise invalid(f"'prefix' must be this job's checkpoint at step {step}", param="prefix")
    try:
        state = json.loads(store.get_bytes(layout.trainer_state_key(prefix)))
        history = {int(row["step"]): row for row in state["history"] if int(row["step"]) <= step}
    except (OSError, KeyError, TypeError, ValueError) as exc:  # the trainer just read it; a race with a delete
        log.warning("could not read the history of %s: %s", prefix, exc)
        events.add(session, job, f"could not read the history of the checkpoint at step {step}",
                   level="warn", attempt=attempt.number)
        return 0
    total_steps = int(body.total_steps or attempt.total_steps or 0)
    if step in history and checkpoint_repo.at_step(session, job.tenant_id, job.job_id, step) is None:
        session.add(Checkpoint(
            checkpoint_id=new_id("ftckpt"), job_id=job.job_id, step=step, attempt=attempt.number, prefix=prefix,
            metrics={"step": float(step), **checkpoint_metrics(history[step])}, created_at=int(time.time()),
            epoch=int(state.get("epoch", 0)) if step > 0 and state.get("index_in_epoch") == 0 else None,
        ))
    have = {int((row.data or {}).get("step", -1)) for row in events.metrics_rows(session, job.tenant_id, job.job_id)}
    missing = sorted(set(history) - have)
    for number in missing:
        data = metrics_data(history[number], total_steps)
        events.add(session, job, metrics_message(data), event_type="metrics", attempt=attempt.number,
                   data={**data, "recovered_from_checkpoint": True})
    if missing:
        events.add(session, job,
                   f"metrics of {len(missing)} step(s) recovered from the checkpoint at step {step}",
                   data={"steps": missing[:50], "count": len(missing)}, attempt=attempt.number)
    return len(missing)


def _forget_pruned(session: Session, job: Job, newest_step: int) -> None:
    """The trainer deletes from the store the checkpoints `domain.retention` does not keep; the
    listing follows the same rule so every listed checkpoint can be downloaded."""
    policy = job.resolved.checkpoint if job.resolved is not None else None
    if policy is None or policy.keep_last <= 0:
        return
    session.flush()
    rows = [r for r in checkpoint_repo.for_job(session, job.tenant_id, job.job_id) if r.step <= newest_step]
    kept = retention.kept_steps([(r.step, r.epoch is not None) for r in rows], policy.keep_last,
                                policy.every_epoch)
    for row in rows:
        if row.step not in kept:
            session.delete(row)


def evaluating(session: Session, job: Job, attempt: Attempt, body: reports.Evaluating) -> None:
    """Training is done and the artifacts are written; the trainer evaluates now."""
    seq = body.seq
    if _already_applied(attempt, seq):
        return
    require_current(job, attempt)
    attempt.last_seq = seq
    if job.status == JobStatus.RUNNING.value:
        transition(session, job, JobStatus.EVALUATING,
                   "Training finished; evaluating the base and the fine-tuned model on the same data",
                   data={"step": body.step})
        # asked as the last step ended, and not yet passed on to the trainer: nothing is left to pause
        # (once passed on, the trainer stops and the job pauses; resumed, it evaluates again)
        if job.pause_requested and not (attempt.handle or {}).get("preempt_sent"):
            job.pause_requested = False
            events.add(session, job, "The pause came as training finished; the job evaluates its model and "
                                     "ends instead", level="warn", attempt=attempt.number)


def complete(session: Session, store: ObjectStore, job: Job, attempt: Attempt, body: reports.Result) -> None:
    """The trainer wrote its final artifacts (and eval results): check the gates, register the
    model with its lineage, finish the job."""
    seq = body.seq
    if _already_applied(attempt, seq):
        return
    require_current(job, attempt)
    attempt.result, attempt.last_seq = body.model_dump(mode="json", ), seq
    attempt.status, attempt.ended_at = AttemptStatus.SUCCEEDED.value, time.time()
    tenant = tenant_repo.by_id(session, job.tenant_id)
    results_key = body.results_key
    if results_key and store.exists(results_key):
        results = file_service.add_generated(
            session, store, job.tenant_id, filename="step_metrics.csv",
            purpose="fine-tune-results", data=store.get_bytes(results_key),
        )
        job.result_files = [results.file_id]
    model_id = parents.model_id(job, tenant.name if tenant else job.tenant_id)
    job.fine_tuned_model = model_id
    job.trained_tokens = body.trained_tokens
    eval_results, report = _gate(session, job, body.eval)
    registry.register(session, store, job, model_id=model_id, artifact_prefix=body.adapter_prefix,
                      artifact_kind=body.artifact_kind, attempts=attempt.number,
                      eval_results=eval_results, gate_report=report)
    events.add(session, job, f"New fine-tuned model created: {model_id}", data={"fine_tuned_model": model_id},
               attempt=attempt.number)
    transition(session, job, JobStatus.SUCCEEDED, "The job has successfully completed",
               data={"fine_tuned_model": model_id, "trained_tokens": job.trained_tokens,
                     "promotable": bool(eval_results is not None and report is not None and report.get("passed"))})


def _gate(session: Session, job: Job, results: dict[str, Any] | None) -> tuple[dict | None, dict | None]:
    """Check the job's gates against the eval results; the verdict goes to the job and its events."""
    resolved = job.resolved
    if not results or resolved is None or resolved.eval is None or not resolved.eval.enabled:
        return None, None
    hyperparameters = {**resolved.hyperparameters.flat(), "lora": asdict(resolved.lora), "method": resolved.method}
    report = evaluation.check_gates(resolved.eval, results, hyperparameters)
    job.eval_results = {**results, "gates": report}
    if report["passed"]:
        events.add(session, job, f"All {len(report['gates'])} eval gates passed; the model can be promoted",
                   data={"gates": report["gates"]})
    else:
        reasons = "; ".join(g["reason"] for g in report["gates"] if not g["passed"])
        advice = " Suggestions: " + " ".join(report["suggestions"]) if report["suggestions"] else ""
        events.add(session, job, f"Eval gates failed: {reasons}. The model is registered but cannot be "
                                 f"promoted to staging or production.{advice}", level="warn",
                   data={"code": "gates_failed", "gates": report["gates"], "suggestions": report["suggestions"]})
    return results, report


def fail(session: Session, job: Job, attempt: Attempt, body: reports.Failure) -> None:
    """The trainer's account of how its attempt failed. A tenant's mistake (bad data, a
    configuration the trainer cannot use, divergence) or a refused report (`report_refused`)
    fails the job: retrying would fail again. A platform fault or out-of-memory is recorded
    on the attempt and told in the events; the attempt's exit then lets the scheduler retry it
    (`scheduler/loop.py`)."""
    seq = body.seq
    if _already_applied(attempt, seq):
        return
    require_current(job, attempt)
    error = tenant_error(body)
    attempt.failure, attempt.last_seq = {**error, "classification": body.classification}, seq
    if body.classification not in reports.FINAL_FAILURE_CLASSES:
        events.add(session, job, f"Attempt {attempt.number} failed: {error['message']}", level="error",
                   data={**error, "classification": body.classification}, attempt=attempt.number, seq=seq)
        return
    attempt.status, attempt.ended_at = AttemptStatus.FAILED.value, time.time()
    attempt.failure_class = body.classification
    transition(session, job, JobStatus.FAILED, f"Fine-tuning job failed: {error['message']}",
               level="error", error=error, data={"code": error["code"], "correlation_id": error["correlation_id"]})


def tenant_error(body: reports.Failure) -> dict[str, Any]:
    """The job's `error` for a failure report: OpenAI's `code`, `message` and `param`, plus the
    `correlation_id` an operator finds the trainer's traceback under. The message is scrubbed
    of paths and tracebacks whatever the trainer sent (`domain/tenant_text.py`)."""
    message = scrub(body.message) or "Training failed"
    if body.classification in ("platform", "report_refused") and body.correlation_id:
        message = f"{message} (error id {body.correlation_id})"
    return {"code": body.code or "training_failed", "message": message,
            "param": scrub(body.param or "", 200) or None,
            "correlation_id": body.correlation_id}
