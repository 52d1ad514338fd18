"""Fine-tuning jobs: create (with idempotency), read, list, cancel, pause, resume; a job's
events (paged; followed live in services/training/event_streams.py), checkpoints and attempts."""

from __future__ import annotations

import difflib
import hashlib
import importlib.util
import json
import logging
import random
import re
import time
from dataclasses import asdict, replace
from pathlib import Path

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from tuneforge import methods
from tuneforge.db.engine import savepoint
from tuneforge.db.pagination import Page
from tuneforge.db.repos import attempts as attempt_repo
from tuneforge.db.repos import base_models as base_model_repo
from tuneforge.db.repos import checkpoints as checkpoint_repo
from tuneforge.db.repos import events
from tuneforge.db.repos import files as file_repo
from tuneforge.db.repos import jobs as job_repo
from tuneforge.db.repos import tenants as tenant_repo
from tuneforge.db.tables import Attempt, BaseModelRow, FileRow, Job, Tenant
from tuneforge.domain.errors import ApiError, conflict, invalid, not_found
from tuneforge.domain.ids import new_id
from tuneforge.domain.job_config import JobRequest, TrainingType
from tuneforge.domain.status import JobStatus
from tuneforge.domain.vocab import TRAINING_TYPES
from tuneforge.planning import hyperparams
from tuneforge.registry import parents
from tuneforge.services.context import Platform
from tuneforge.services.datasets.checks import DataCheckFailed
from tuneforge.services.serving import base_models
from tuneforge.services.serving.judges import JudgeCheck
from tuneforge.services.tenancy import audit, quotas
from tuneforge.services.training import artifacts, estimates, evaluation, graders, integrations
from tuneforge.services.training.input_files import check_file
from tuneforge.services.training.planning import check_hardware_exists, check_strategy, plan_job
from tuneforge.services.training.transitions import is_terminal, transition
from tuneforge.services.training.validation import validate_job
from tuneforge.settings import Settings
from tuneforge.storage.store import ObjectStore

_SUFFIX = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_log = logging.getLogger(__name__)


def request_hash(request: JobRequest) -> str:
    canonical = json.dumps(request.to_json(), sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def qlora_available(settings: Settings) -> bool:
    """QLoRA needs trainers with a CUDA GPU and bitsandbytes (4-bit NF4 kernels)."""
    if settings.qlora in ("on", "off"):
        return settings.qlora == "on"
    return Path("/proc/driver/nvidia/version").exists() and importlib.util.find_spec("bitsandbytes") is not None


def _check_request(request: JobRequest, settings: Settings) -> None:
    method = methods.get(request.method_type).name  # 400 naming method.type if unknown
    training_type = request.training_type_kind
    if training_type not in TRAINING_TYPES:
        raise invalid(f"training_type.type {training_type!r} is not supported; use one of "
                      f"{', '.join(TRAINING_TYPES)}", param="training_type.type")
    if request.distributed is not None:
        check_strategy(request.distributed.strategy, training_type)
    deadline = request.resources.deadline if request.resources is not None else None
    if deadline is not None and deadline <= time.time():
        raise invalid(f"resources.deadline ({deadline}) is in the past: it is a time in unix seconds the job "
                      "should finish by", param="resources.deadline")
    if training_type == "qlora" and not qlora_available(settings):
        raise invalid(
            "training_type.type 'qlora' needs trainers with an NVIDIA GPU (CUDA) and the bitsandbytes package for "
            "4-bit NF4 weights; this platform's trainers have neither (TUNEFORGE_QLORA=auto found no NVIDIA "
            "driver or no bitsandbytes here). Use 'lora' (same adapter, 16-bit base: about 4x the base model's "
            "memory of QLoRA) or ask the operator to enable QLoRA on GPU trainers (TUNEFORGE_QLORA=on).",
            param="training_type.type", code="unsupported_training_type")
    integrations.check_static(settings, request)
    if request.hyperparameters is not None and request.method is not None and (
            request.method_type != "supervised" or request.method.block is not None):
        raise invalid("hyperparameters (deprecated) and method both set hyperparameters; give them once, in "
                      f"method.{request.method_type}.hyperparameters", param="hyperparameters",
                      code="conflicting_parameters")
    if request.suffix is not None and not _SUFFIX.match(request.suffix):
        raise invalid("suffix may use up to 64 letters, digits, '-', '_' and '.'", param="suffix")
    if request.metadata is not None and len(request.metadata) > 16:
        raise invalid("metadata may hold at most 16 keys", param="metadata")
    requested = hyperparams.requested_hyperparameters(request)
    hyperparams.check_static(requested, method)
    if request.training_type is not None:
        hyperparams.resolve_lora(request.training_type)
    resources = request.resources
    if resources is not None and resources.gpus and resources.nodes and resources.gpus % resources.nodes:
        raise invalid(f"resources.gpus ({resources.gpus}) must split evenly over resources.nodes "
                      f"({resources.nodes})", param="resources.nodes")


# base models named in the 400 of a model that does not exist (the rest: GET /v1/models)
_NAMED_BASE_MODELS = 20


def _model_not_available(session: Session, model: str) -> ApiError:
    """The 400 for a `model` that is neither a base model nor one of the tenant's: the closest base
    model's name, and the base models there are."""
    names = sorted(row.name for row in base_model_repo.list_all(session))
    message = f"Model {model!r} is not available for fine-tuning or does not exist"
    close = difflib.get_close_matches(model, names, n=1, cutoff=0.5)
    if close:
        message += f"; did you mean {close[0]!r}?"
    if names:
        shown = ", ".join(names[:_NAMED_BASE_MODELS]) + (", …" if len(names) > _NAMED_BASE_MODELS else "")
        message += f" Base models: {shown} (GET /v1/models lists them with your fine-tuned models)"
    return invalid(message, param="model", code="model_not_available")


def _check_inputs(session: Session, settings: Settings, tenant: Tenant, request: JobRequest,
                  store: ObjectStore | None = None, *, allow_processing: bool = False,
                  ) -> tuple[BaseModelRow, FileRow, FileRow | None, JobRequest, parents.Parent | None]:
    """`store`: where the base model's config is, to check LoRA target modules against it. Returns
    the request as the job takes it: a continued job's with its parent's LoRA settings.
    `allow_processing`: files still being validated are accepted (a create: the job waits for them)."""
    _check_request(request, settings)
    base = base_model_repo.by_name(session, request.model)
    parent = None
    if base is None:
        parent = parents.find(session, tenant.tenant_id, tenant.name, request.model)
        if parent is None:
            raise _model_not_available(session, request.model)
        base, request = _continued(session, request, parent)
    if store is not None:
        base_models.check_target_modules(store, base, request.training_type)
    method = request.method_type
    training = check_file(session, tenant.tenant_id, request.training_file, "training_file",
                          settings.min_training_examples, method, allow_processing=allow_processing)
    validation = None
    if request.validation_file:
        validation = check_file(session, tenant.tenant_id, request.validation_file, "validation_file", 1, method,
                                allow_processing=allow_processing)
    evaluation.check_request(session, settings, tenant.tenant_id, request)
    graders.check_job(settings, request, hyperparams.requested_hyperparameters(request),
                      JudgeCheck(session, settings, tenant.tenant_id, tenant.name))
    integrations.check_secrets(session, settings, tenant.tenant_id, request)
    if request.lock is not None:
        _check_lock(request, base, training, validation)
    return base, training, validation, request, parent


def check_inputs(session: Session, settings: Settings, tenant: Tenant, request: JobRequest,
                 store: ObjectStore | None = None) -> None:
    """Everything a job create checks of a request before it stores anything (400 naming the field)."""
    _check_inputs(session, settings, tenant, request, store)


def _check_lock(request: JobRequest, base: BaseModelRow, training: FileRow, validation: FileRow | None) -> None:
    """A re-run finds what its lock names: the same base weights and the same data bytes."""
    lock = request.lock
    assert lock is not None
    if (lock.base_model.name, lock.base_model.sha256) != (base.name, base.sha256):
        raise invalid(f"lock.base_model: the job was exported on {lock.base_model.name} with SHA-256 "
                      f"{lock.base_model.sha256[:12]}…; this one trains on {base.name} with {base.sha256[:12]}…",
                      param="lock.base_model.sha256", code="lock_mismatch")
    for name, locked, row in (("training_file", lock.training_file, training),
                              ("validation_file", lock.validation_file, validation)):
        if locked is None and row is None:
            continue
        if locked is None or row is None or locked.sha256 != row.sha256:  # the bytes, whatever the file's id
            raise invalid(f"lock.{name}: {row.file_id if row else 'no file'} is not the data the exported job "
                          f"trained on ({locked.id if locked else 'none'})", param=f"lock.{name}.sha256",
                          code="lock_mismatch")


def _continued(session: Session, request: JobRequest, parent: parents.Parent) -> tuple[BaseModelRow, JobRequest]:
    """A job that continues `parent`: its base (the parent's, the same weights) and the request with
    the parent's adapter settings; what cannot continue it answers 400 naming the field."""
    if parent.kind != "adapter" and parent.step is not None:
        raise invalid(f"{request.model} is a checkpoint of a full fine-tune, kept as training state; continue "
                      "from the job's final model", param="model", code="unsupported_parent")
    if not parent.finished:
        raise invalid(f"{request.model} is not finished", param="model", code="model_not_available")
    base = base_model_repo.by_name(session, parent.base_model)
    if base is None or base.sha256 != parent.base_sha256:
        raise invalid(f"{request.model} was trained on {parent.base_model} as it was then; that base model has "
                      "been removed or replaced since", param="model", code="parent_base_changed")
    asked = request.training_type
    if parent.kind != "adapter":  # a full fine-tune: its weights are the new job's starting point
        if asked is not None and asked.type != "full":
            raise invalid(f"{request.model} is a full fine-tune: it continues as one (training_type 'full' or "
                          "left out); an adapter on its weights is not supported yet", param="training_type.type",
                          code="unsupported_parent")
        return base, request.model_copy(update={"training_type": TrainingType(type="full")})
    if asked is not None and asked.type == "full":
        raise invalid("training_type.type 'full' cannot continue an adapter; leave training_type out (the "
                      "adapter's settings are kept) or use 'lora'/'qlora'", param="training_type.type")
    lora = parent.lora()
    if lora is None:
        raise invalid(f"{request.model} has no adapter settings to continue from", param="model",
                      code="model_not_available")
    targets = lora["target_modules"]
    kept = {"rank": lora["rank"], "alpha": lora["alpha"], "dropout": lora["dropout"],
            "target_modules": targets if isinstance(targets, str) else list(targets)}
    given = asked.model_dump(exclude_unset=True) if asked is not None else {}
    for key, value in kept.items():
        if key in given and given[key] != "auto" and given[key] != value:
            raise invalid(f"training_type.{key} is {given[key]!r}, but {request.model}'s adapter has {value!r}: a "
                          "continued adapter keeps its shape (leave it out)", param=f"training_type.{key}",
                          code="parent_mismatch")
    training_type = TrainingType(type=asked.type if asked is not None else "lora", **kept)
    return base, request.model_copy(update={"training_type": training_type})


def estimate_job(session: Session, platform: Platform, tenant: Tenant, request: JobRequest) -> dict:
    """The figures a job with this body would get, without creating it (or any prepared data). The
    answer is cached by content and the data passes a tenant causes are bounded
    (`services/training/estimates.py`: one at a time, `estimates_per_minute`; 429 beyond)."""
    base, training, validation, request, _parent = _check_inputs(session, platform.settings, tenant, request,
                                                                 platform.store)
    settings = platform.settings
    key = estimates.content_key(tenant.tenant_id, request.to_json(), training_sha256=training.sha256,
                                validation_sha256=validation.sha256 if validation else None,
                                base_sha256=base.sha256, pii_policy=tenant.pii_policy)
    cache = estimates.cache_for(settings.estimate_cache_entries)
    answer = cache.get(key, time.time())
    if answer is None:
        with estimates.admitted(settings.home, tenant.tenant_id, settings.estimates_per_minute):
            answer = _estimate_answer(session, platform, tenant, request, base, training, validation)
        cache.put(key, answer, time.time())
    if isinstance(answer, ApiError):
        raise replace(answer)  # a fresh error each time: the cached one carries no traceback
    return {**answer, "queue_position": estimates.queue_position(session)}


def _estimate_answer(session: Session, platform: Platform, tenant: Tenant, request: JobRequest, base: BaseModelRow,
                     training: FileRow, validation: FileRow | None) -> dict | ApiError:
    """The estimate, or the 400 its data or hyperparameters answer (as cacheable as the figures)."""
    try:
        plan = plan_job(session, platform, tenant, request, seed=request.seed or 0, training=training,
                        validation=validation, base=base, keep_dataset=False)
    except DataCheckFailed as exc:
        first = exc.report.errors.first() or {"code": "invalid_file"}
        return invalid(exc.report.summary(), param=exc.which, code=first["code"])
    except ApiError as exc:
        if exc.status_code >= 500 or exc.status_code == 429:
            raise  # not an answer about this body: never cached
        return exc
    return {
        "object": "fine_tuning.job.estimate",
        "model": base.name,
        **asdict(plan.estimate),
        "train_tokens_per_epoch": plan.prepared.train_tokens,
        "validation_examples": plan.prepared.valid_examples,
        "hyperparameters": asdict(plan.hyperparameters),
        "dataset_id": plan.prepared.dataset_id,
    }


def together_price_fields(session: Session, tenant: Tenant, estimate: dict) -> dict:
    """Together's estimate-price answer, from an estimate: the price, whether the tenant's quota
    lets the job in now, and the GPU-hours left this month (null without a hard cap)."""
    quota = quotas.limits(tenant)
    used = quotas.billable_gpu_hours(session, tenant, time.time()) if quota.gpu_hours_hard is not None else 0.0
    left = None if quota.gpu_hours_hard is None else max(0.0, quota.gpu_hours_hard - used)
    try:
        quotas.check_admission(session, tenant)
        allowed = left is None or estimate["estimated_gpu_hours"] <= left
    except ApiError:
        allowed = False
    return {"estimated_total_price": estimate["estimated_price"], "allowed_to_proceed": allowed,
            "user_limit": left, "estimated_train_token_count": estimate["training_tokens"]}


def submit_job(session: Session, platform: Platform, tenant: Tenant, request: JobRequest,
               idempotency_key: str | None = None) -> Job:
    """Job create as the API does it: `create_job`, then a new job with small files is
    validated at once (see `_validate_small_job`)."""
    if idempotency_key is not None and not (1 <= len(idempotency_key) <= 255):
        raise invalid("Idempotency-Key must be 1-255 characters", param="Idempotency-Key")
    check_hardware_exists(platform, request)
    job, created = create_job(session, platform.settings, tenant, request, idempotency_key, platform.store)
    if created:
        # the job is stored and the tenant's lock released before any data is read: validation
        # takes its time without holding up the tenant's (or, on SQLite, anyone's) writes
        session.commit()
        _validate_small_job(session, platform, job)
    return job


def _validate_small_job(session: Session, platform: Platform, job: Job) -> None:
    """Validate a job with small files now, right after it was stored, so the job comes back
    queued with its estimate, or failed with the data error. The scheduler may pick the same
    job meanwhile; `validate_job` writes only while the job is still validating_files."""
    files = [file_id for file_id in (job.training_file, job.validation_file) if file_id]
    size = sum(row.size_bytes for file_id in files if (row := file_repo.get(session, job.tenant_id, file_id)))
    if size > platform.settings.inline_validation_max_bytes:
        return
    try:
        validate_job(session, platform, job)
        session.commit()
    except Exception:  # noqa: BLE001 - e.g. a tokenizer that fails to load: the scheduler retries and reports
        _log.exception("inline validation of %s failed; the scheduler will validate it", job.job_id)
        session.rollback()
        session.refresh(job)


def create_job(
    session: Session,
    settings: Settings,
    tenant: Tenant,
    request: JobRequest,
    idempotency_key: str | None = None,
    store: ObjectStore | None = None,
) -> tuple[Job, bool]:
    """Returns (job, created). A repeated Idempotency-Key returns the first job. With `store`,
    LoRA target modules are checked against the base model (`base_models.check_target_modules`)."""
    body_hash = request_hash(request)
    if idempotency_key:
        existing = job_repo.by_idempotency_key(session, tenant.tenant_id, idempotency_key)
        if existing is not None:
            return _replay(existing, body_hash), False
    base, training, validation, request, parent = _check_inputs(session, settings, tenant, request, store,
                                                                allow_processing=True)
    # the tenant's row stays locked until this request commits: creates racing each other are
    # counted one after the other, and none passes a limit another has just reached
    # artifacts grow by trainers' writes, not by creates: read before the lock, so that no other
    # request waits on a walk of the tenant's objects (403 storage_quota_exceeded)
    quotas.check_artifacts(settings, store, tenant)
    locked = tenant_repo.lock(session, tenant.tenant_id) or tenant
    quotas.check_admission(session, locked)  # 403 quota_exceeded / 429 quota_exceeded: nothing is created
    job = Job(
        job_id=new_id("ftjob"),
        tenant_id=tenant.tenant_id,
        model=base.name,
        base_model_sha256=base.sha256,
        training_file=request.training_file,
        validation_file=request.validation_file,
        status=JobStatus.VALIDATING_FILES.value,
        attempt=0,
        seed=request.seed if request.seed is not None else random.randint(0, 2**31 - 1),
        suffix=request.suffix,
        user_metadata=request.metadata,
        request=request,
        result_files=[],
        idempotency_key=idempotency_key,
        request_hash=body_hash,
        created_at=int(time.time()),
    )
    if parent is not None and parent.kind != "adapter":  # read in place: see registry/parents.py
        job.parent = {**parent.lineage(), "model_prefix": parent.weights_prefix}
    elif parent is not None:
        if store is None:
            raise RuntimeError("a continued job needs the object store to copy its parent's adapter")
        job.parent = {**parent.lineage(), "adapter_prefix": parents.copy_adapter(store, parent, tenant.tenant_id,
                                                                                 job.job_id)}
    try:
        with savepoint(session):
            session.add(job)
            session.flush()
    except IntegrityError:
        # another request with the same Idempotency-Key won the race
        existing = job_repo.by_idempotency_key(session, tenant.tenant_id, idempotency_key or "")
        if existing is None:
            raise
        return _replay(existing, body_hash), False
    events.add(session, job, f"Created fine-tuning job: {job.job_id}", data={"status": job.status})
    # the first state of the job's life, in the audit log beside its transitions (the request that
    # created it is recorded by the API's edge once answered, with the caller's key and request id)
    audit.platform_change(session, f"job.{job.status}", "job", job.job_id, tenant.tenant_id,
                          {"training_file": job.training_file})
    events.add(session, job, f"Validating training file: {job.training_file}"
               + (f" and validation file: {job.validation_file}" if job.validation_file else ""))
    waiting = [row.file_id for row in (training, validation) if row is not None and row.status == "processing"]
    if waiting:
        events.add(session, job, f"Waiting for the upload validation of {' and '.join(waiting)} to finish",
                   data={"code": "files_processing", "file_ids": waiting})
    return job, True


def _replay(job: Job, body_hash: str) -> Job:
    if job.request_hash != body_hash:
        raise conflict(
            "Idempotency-Key was already used with a different request body",
            param="Idempotency-Key", code="idempotency_key_reused",
        )
    return job


def get_job(session: Session, tenant_id: str, job_id: str) -> Job:
    job = job_repo.get(session, tenant_id, job_id)
    if job is None:
        raise not_found_job(job_id)
    return job


def not_found_job(job_id: str) -> ApiError:
    return not_found(f"No such fine-tuning job: {job_id}", param="fine_tuning_job_id")


def list_jobs(session: Session, tenant_id: str, *, metadata: dict[str, str], after: str | None,
              limit: int) -> Page:
    return job_repo.page(session, tenant_id, metadata=metadata, after=after, limit=limit)


def cancel_job(session: Session, tenant_id: str, job_id: str, store: ObjectStore | None = None) -> Job:
    job = get_job(session, tenant_id, job_id)
    if is_terminal(job):
        raise ApiError(
            400, f"Job {job_id} has already {job.status}; it cannot be cancelled",
            param="fine_tuning_job_id", code="job_not_cancellable",
        )
    running = job.status in (JobStatus.RUNNING.value, JobStatus.EVALUATING.value)
    job.cancel_requested = True
    transition(session, job, JobStatus.CANCELLED, "Fine-tuning job cancelled")
    if not running and store is not None:  # a running trainer is stopped first; the scheduler discards then
        artifacts.discard_checkpoints(session, store, job)
    return job


def pause_job(session: Session, tenant_id: str, job_id: str) -> Job:
    """Queued: paused at once. Running: the trainer is asked to checkpoint and stop; the job
    shows `pausing` (strict statuses), then `paused` once it has. Evaluating, or anything else,
    cannot be paused: 400."""
    job = get_job(session, tenant_id, job_id)
    if job.status == JobStatus.QUEUED.value:
        transition(session, job, JobStatus.PAUSED, "Fine-tuning job paused")
    elif job.status == JobStatus.EVALUATING.value:
        # training is done and the trainer evaluates the model it wrote: nothing is left to pause
        raise ApiError(400, f"Job {job_id} has finished training and is evaluating the fine-tuned model; it cannot "
                            "be paused now (cancel it, or wait for it to finish)",
                       param="fine_tuning_job_id", code="job_not_pausable")
    elif job.status == JobStatus.RUNNING.value:
        if not job.pause_requested:
            job.pause_requested = True
            events.add(session, job, "Pause requested: the trainer checkpoints and stops")
    elif job.status != JobStatus.PAUSED.value:
        raise ApiError(400, f"Job {job_id} is {job.status}; only a queued or running job can be paused",
                       param="fine_tuning_job_id", code="job_not_pausable")
    return job


def resume_job(session: Session, tenant_id: str, job_id: str, settings: Settings | None = None,
               store: ObjectStore | None = None) -> Job:
    """A paused job goes back to the queue and continues from its newest checkpoint. Resuming adds a
    waiting job, so it is admitted like a create (`quotas.check_admission`: the queue cap, 429, and
    the month's GPU-hours, 403; with `settings` and `store`, the artifacts' storage quota, 403),
    counted under the tenant's row lock: pause, create and resume cannot hold more queued jobs
    than the cap."""
    job = get_job(session, tenant_id, job_id)
    _require_paused(job)
    owner = tenant_repo.by_id(session, tenant_id)
    if settings is not None and owner is not None:  # before the lock, as at create
        quotas.check_artifacts(settings, store, owner)
    tenant = tenant_repo.lock(session, tenant_id)
    session.refresh(job)  # afresh under the lock: a parallel resume of this job has already moved it
    _require_paused(job)
    if tenant is not None:
        quotas.check_admission(session, tenant)
    job.pause_requested = False
    transition(session, job, JobStatus.QUEUED, "Fine-tuning job resumed; it continues from its newest checkpoint")
    return job


def _require_paused(job: Job) -> None:
    if job.status != JobStatus.PAUSED.value:
        raise ApiError(400, f"Job {job.job_id} is {job.status}; only a paused job can be resumed",
                       param="fine_tuning_job_id", code="job_not_resumable")


# ---- a job's events, checkpoints and attempts ------------------------------------------------
def list_events(session: Session, tenant_id: str, job_id: str, *, after: str | None, limit: int) -> Page:
    job = get_job(session, tenant_id, job_id)
    return events.page(session, job.tenant_id, job.job_id, after=after, limit=limit)


def list_checkpoints(session: Session, job: Job, *, after: str | None, limit: int) -> Page:
    """The job's checkpoints; none for a failed job (`parents.checkpoints_offered`)."""
    if not parents.checkpoints_offered(job):
        return Page([], False)
    return checkpoint_repo.page(session, job.tenant_id, job.job_id, after=after, limit=limit)


def list_attempts(session: Session, tenant_id: str, job_id: str) -> list[Attempt]:
    job = get_job(session, tenant_id, job_id)
    return attempt_repo.for_job(session, job.tenant_id, job.job_id)
