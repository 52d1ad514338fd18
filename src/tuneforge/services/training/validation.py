"""validating_files -> queued (or failed): plan the job (check its data against
the base model's tokenizer, prepare the dataset, resolve "auto" values,
estimate the cost) and keep the report."""

from __future__ import annotations

import json
from dataclasses import asdict, replace

from sqlalchemy.orm import Session

from tuneforge.db.repos import base_models as base_model_repo
from tuneforge.db.repos import events
from tuneforge.db.repos import files as file_repo
from tuneforge.db.repos import jobs as job_repo
from tuneforge.db.repos import tenants as tenant_repo
from tuneforge.db.tables import FileRow, Job
from tuneforge.domain.errors import ApiError
from tuneforge.domain.resolved import DivergencePolicy, ResolvedResources
from tuneforge.domain.spec import CheckpointPolicy
from tuneforge.domain.status import JobStatus
from tuneforge.planning.hardware import hardware_ask, why_nowhere
from tuneforge.planning.policy import Node, QueuedJob, place
from tuneforge.planning.pools import PoolSetup, allowed_pools
from tuneforge.registry import lineage
from tuneforge.services.context import Platform
from tuneforge.services.datasets.checks import DataCheckFailed
from tuneforge.services.training import evaluation
from tuneforge.services.training.input_files import check_contents, failed_file_error
from tuneforge.services.training.planning import inventory_hardware, on_shared_pool, plan_job
from tuneforge.services.training.transitions import transition
from tuneforge.storage import layout


def validate_job(session: Session, platform: Platform, job: Job) -> None:
    request = job.request
    training = file_repo.get(session, job.tenant_id, job.training_file)
    validation = file_repo.get(session, job.tenant_id, job.validation_file) if job.validation_file else None
    base = base_model_repo.by_name(session, job.model)
    tenant = tenant_repo.by_id(session, job.tenant_id)
    if training is None or base is None or tenant is None or (job.validation_file and validation is None):
        _fail(session, job, "invalid_training_file", "the training file, validation file or base model was deleted")
        return
    if not _files_ready(session, platform, job, training, validation):
        return
    report_key = layout.job_report_key(job.tenant_id, job.job_id)
    try:
        plan = plan_job(session, platform, tenant, request, seed=job.seed, training=training,
                        validation=validation, base=base)
    except DataCheckFailed as exc:
        platform.store.put_bytes(report_key, json.dumps(exc.report.to_dict()).encode())
        first = exc.report.errors.first() or {"code": "invalid_file"}
        _fail(session, job, first["code"], exc.report.summary(f"GET /v1/fine_tuning/jobs/{job.job_id}/validation"),
              param=exc.which)
        return
    except ApiError as exc:
        _fail(session, job, "invalid_hyperparameters", exc.message, param=exc.param)
        return
    platform.store.put_bytes(report_key, json.dumps(plan.prepared.report).encode())
    settings = platform.settings
    wrong_hardware = why_nowhere(hardware_ask(plan.resources), inventory_hardware(platform))
    if wrong_hardware:
        _fail(session, job, "resources_unavailable", wrong_hardware[1], param=wrong_hardware[0])
        return
    unplaceable = _never_fits(platform, plan.resources)
    if unplaceable:
        _fail(session, job, "resources_unavailable", unplaceable, param="resources.gpus")
        return
    no_pool = _no_pool_fits(session, platform, job, plan.resources)
    if no_pool:
        _fail(session, job, "resources_unavailable", no_pool[1], param=no_pool[0])
        return
    policy, divergence = request.checkpointing, request.divergence
    checkpoint = CheckpointPolicy(
        every_steps=(policy and policy.every_steps) or settings.default_checkpoint_every_steps,
        keep_last=(policy and policy.keep_last) or settings.default_checkpoint_keep_last,
        every_minutes=(policy and policy.every_minutes) or 0.0,
        keep_on_cancel=bool(policy and policy.keep_on_cancel),
        every_epoch=policy.every_epoch if policy is not None and policy.every_epoch is not None else True,
    )
    divergence_policy = DivergencePolicy(
        loss_multiple=(divergence and divergence.loss_multiple) or settings.divergence_loss_multiple,
        patience_steps=(divergence and divergence.patience_steps) or settings.divergence_patience_steps,
        min_increase=divergence.min_increase if divergence and divergence.min_increase is not None
        else settings.divergence_min_increase,
    )
    resolved_eval = evaluation.resolve(session, settings, job.tenant_id, request)
    shared = on_shared_pool(settings, plan, continued=bool(job.parent),
                            asked_gpus=bool(request.resources and request.resources.gpus))
    if shared:  # no GPUs of its own: its steps run on its base's shared worker (train/pool_client.py)
        plan.resources = replace(plan.resources, gpus=0, shared_pool=True)
    if not _still_validating(session, job):
        return
    job.resolved = plan.resolved(checkpoint, divergence_policy, resolved_eval)
    job.config_hash = lineage.config_hash(job, training, validation)
    _point_out_duplicate(session, job)
    prepared = plan.prepared
    warnings = sum(item.get("count", 0) for item in prepared.report.get("warnings", {}).values())
    # OpenAI's words; what the validation found is in the data
    if shared:
        events.add(session, job, f"This job trains on the shared co-training worker of {job.model} (a small "
                                 "LoRA job within the platform's pool limits): it takes no GPUs of its own",
                   data={"code": "shared_pool", "base_model": job.model})
    transition(session, job, JobStatus.QUEUED, "Files validated, moving job to queued state",
               data={"shared_pool": shared, "dataset_id": prepared.dataset_id,
                     "train_examples": prepared.train_examples, "valid_examples": prepared.valid_examples,
                     "train_tokens": prepared.train_tokens,
                     "warnings": warnings, "reused_dataset": prepared.reused, "estimate": asdict(plan.estimate)})


def _files_ready(session: Session, platform: Platform, job: Job, training: FileRow,
                 validation: FileRow | None) -> bool:
    """Whether the job's files have passed their upload validation. A file still processing keeps
    the job validating_files (the scheduler looks again next tick); a file that ended in error, or
    whose contents do not fit the job, fails it with that file's error."""
    minimum = platform.settings.min_training_examples
    for row, param, min_examples in ((training, "training_file", minimum), (validation, "validation_file", 1)):
        if row is None:
            continue
        if row.status == "processing":
            return False
        try:
            if row.status == "error":
                raise failed_file_error(row, param)
            check_contents(row, param, min_examples, job.request.method_type)
        except ApiError as exc:
            _fail(session, job, exc.code or "invalid_training_file", exc.message, param=param)
            return False
    return True


def _point_out_duplicate(session: Session, job: Job) -> None:
    """An earlier job of the tenant with the same configuration hash would train the same weights."""
    twin = job_repo.first_twin(session, job.tenant_id, job.config_hash, job.job_id)
    if twin is None:
        return
    model = f" (model {twin.fine_tuned_model})" if twin.fine_tuned_model else ""
    events.add(session, job, f"This job has the same configuration as {twin.job_id}{model}, which is "
                             f"{twin.status}: same base model, data, method, hyperparameters and seed",
               level="warn", data={"code": "duplicate_config", "config_hash": job.config_hash,
                                   "same_as_job": twin.job_id, "same_as_model": twin.fine_tuned_model})


def _still_validating(session: Session, job: Job) -> bool:
    """Take the write lock and read the job again: the create request and the scheduler may both
    validate a new job, and only the first to finish records the outcome."""
    job_repo.reread_for_update(session, job)
    return job.status == JobStatus.VALIDATING_FILES.value


def _fail(session: Session, job: Job, code: str, message: str, param: str | None = "training_file") -> None:
    if not _still_validating(session, job):
        return
    transition(session, job, JobStatus.FAILED, f"Validation failed: {message}", level="error",
               error={"code": code, "message": message, "param": param})


def _never_fits(platform: Platform, resources: ResolvedResources) -> str | None:
    """Why the job could not be placed even on an idle inventory, or None (also when this
    process cannot know the inventory: the job waits for a scheduler that can place it)."""
    capacity = platform.capacity()
    if capacity is None:
        return None
    nodes = [Node(n.name, n.total_gpus, set(range(n.total_gpus)), gpu_model=n.gpu_model,
                  gpu_memory_gb=n.gpu_memory_gb) for n in capacity.nodes]
    probe = QueuedJob("probe", "probe", "standard", resources.gpus, 0.0, 0.0, resources.gpus_per_node,
                      hardware=hardware_ask(resources))
    if place(probe, nodes) is not None:
        return None
    nodes = [node for node in nodes if node.fits(probe.hardware)]  # why_nowhere leaves some
    sizes = sorted({n.total for n in nodes}, reverse=True)
    shape = (f"{probe.gpus // probe.gpus_per_node} nodes with {probe.gpus_per_node} GPUs each"
             if probe.gpus_per_node else "all of them on one node")
    return (f"resources.gpus = {probe.gpus} cannot be placed: the job needs {shape}, and the inventory has "
            f"{len(nodes)} node(s) of {', '.join(map(str, sizes))} GPUs")


def _no_pool_fits(session: Session, platform: Platform, job: Job,
                  resources: ResolvedResources) -> tuple[str, str] | None:
    """(param, why) when no capacity pool the job may use could ever hold it: none of the kind it
    asked for at its price, or none with room on an idle inventory."""
    pools = PoolSetup.from_settings(platform.settings)
    capacity = platform.capacity()
    if pools is None or capacity is None:
        return None
    tier = tenant_repo.tier_of(session, job.tenant_id) or "standard"
    ask = pools.ask(tier, resources.capacity, None, resources.max_price, 0, float("-inf"))
    allowed = allowed_pools(ask, 0.0, list(pools.pools.values()), 0.0, pools.rules)
    if not allowed:
        price = f" at {resources.max_price} or less per GPU-hour" if resources.max_price is not None else ""
        kind = {"spot": "spot", "on_demand": "on-demand or reserved"}.get(ask.capacity, "")
        return ("resources.max_price" if resources.max_price is not None else "resources.capacity",
                f"no {kind + ' ' if kind else ''}capacity pool{price} exists: the platform has "
                + ", ".join(f"{p.name} ({p.kind}, {p.price_per_gpu_hour} per GPU-hour)" for p in pools.pools.values()))
    nodes = [Node(n.name, n.total_gpus, set(range(n.total_gpus)), pools.node_pool(n.name, n.pool), n.gpu_model,
                  n.gpu_memory_gb) for n in capacity.nodes]
    probe = QueuedJob("probe", "probe", tier, resources.gpus, 0.0, 0.0, resources.gpus_per_node, pools=allowed,
                      hardware=hardware_ask(resources))
    if place(probe, nodes) is None:
        return ("resources.gpus", f"resources.gpus = {resources.gpus} does not fit the nodes of the pools it may "
                                  f"use ({', '.join(allowed)})")
    return None
