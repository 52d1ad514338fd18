"""Builds the JobSpec of one attempt from the job's rows."""

from __future__ import annotations

import hashlib

from sqlalchemy.orm import Session

from tuneforge.db.repos import base_models as base_model_repo
from tuneforge.db.repos import files as file_repo
from tuneforge.db.tables import BaseModelRow, Job
from tuneforge.domain.spec import (
    POOL_METHOD,
    BaseModelRef,
    CheckpointPolicy,
    DataFileRef,
    Hyperparameters,
    JobSpec,
    LoraConfig,
)
from tuneforge.settings import Settings
from tuneforge.storage import layout
from tuneforge.storage.proxy import proxy_url


def build_spec(session: Session, settings: Settings, job: Job, number: int, token: str) -> JobSpec:
    if job.resolved is not None and job.resolved.method == POOL_METHOD:
        return _pool_spec(session, settings, job, number, token)
    base = base_model_repo.by_name(session, job.model)
    training = file_repo.get(session, job.tenant_id, job.training_file)
    if base is None or training is None:
        raise LookupError(f"{job.job_id}: base model or training file is gone")
    resolved = job.resolved
    if resolved is None:
        raise LookupError(f"{job.job_id}: the job was never validated")
    # the trainer reads the prepared (normalised) dataset, whatever the upload's format
    data = resolved.data
    validation = None
    if data.valid_key:
        validation = DataFileRef(file_id=job.validation_file or f"{training.file_id}:split",
                                 key=data.valid_key, sha256="")
    divergence = resolved.divergence
    return JobSpec(
        job_id=job.job_id,
        tenant_id=job.tenant_id,
        attempt=number,
        seed=job.seed,
        base_model=_starting_weights(job, base),
        training_file=DataFileRef(file_id=training.file_id, key=data.train_key or training.key,
                                  sha256=training.sha256),
        validation_file=validation,
        method=resolved.method,
        training_type=resolved.training_type,
        lora=resolved.lora,
        hyperparameters=resolved.hyperparameters,
        checkpoint=resolved.checkpoint,
        storage_url=trainer_storage_url(settings, job.job_id),
        callback_url=settings.resolved_public_url,
        job_token=token,
        gpus=resolved.gpus,
        heartbeat_interval_s=settings.heartbeat_interval_s,
        preempt_grace_s=settings.preempt_grace_s,
        divergence_loss_multiple=divergence.loss_multiple if divergence else settings.divergence_loss_multiple,
        divergence_patience_steps=divergence.patience_steps if divergence else settings.divergence_patience_steps,
        divergence_min_increase=divergence.min_increase if divergence else settings.divergence_min_increase,
        cache_dir=str(layout.home_base_model_cache_dir(settings.home).resolve()),
        gradient_checkpointing=resolved.resources.gradient_checkpointing,
        distributed_strategy=resolved.resources.strategy,
        fused_loss=settings.fused_loss,
        grader_python=settings.grader_python,
        grader_timeout_s=settings.grader_timeout_s,
        rollout_vllm_memory=settings.rft_vllm_gpu_memory,
        grader_embeddings=settings.grader_embeddings or "",
        eval=resolved.eval if resolved.eval is not None and resolved.eval.enabled else None,
        shared_pool=resolved.resources.shared_pool,
        init_adapter_prefix=(job.parent or {}).get("adapter_prefix", ""),
        integrations=[item.model_dump(mode="json", exclude_none=True) for item in job.request.integrations or []],
        extra=dict(resolved.extra),
    )


def trainer_storage_url(settings: Settings, job_id: str) -> str:
    """The store a trainer of `job_id` opens: the control plane's object proxy for that job, which its
    job token opens (storage/proxy.py), unless the operator hands trainers the store itself."""
    if settings.trainer_storage == "direct":
        return settings.resolved_storage_url
    return proxy_url(settings.resolved_public_url, job_id)


def _starting_weights(job: Job, base: BaseModelRow) -> BaseModelRef:
    """The weights the job starts from: its base model's; a job continuing a full fine-tune starts
    from that model's (its files read in place; cached on trainer nodes under a key of their own)."""
    continued = (job.parent or {}).get("model_prefix")
    if not continued:
        return BaseModelRef(name=base.name, sha256=base.sha256, prefix=base.prefix, source=base.source)
    key = hashlib.sha256(f"{base.sha256}|{continued}".encode()).hexdigest()
    return BaseModelRef(name=base.name, sha256=key, prefix=continued, source=base.source)


def _pool_spec(session: Session, settings: Settings, job: Job, number: int, token: str) -> JobSpec:
    """A co-training pool's attempt (services/training_api/scheduled.py): its base model and pool; no
    data, no training loop. Its job token is also what it asks its pool's work with."""
    base = base_model_repo.by_name(session, job.model)
    if base is None or job.resolved is None or base.sha256 != job.base_model_sha256:
        raise LookupError(f"{job.job_id}: the pool's base model {job.model} is gone or was replaced")
    return JobSpec(
        job_id=job.job_id, tenant_id=job.tenant_id, attempt=number, seed=0,
        base_model=BaseModelRef(name=base.name, sha256=base.sha256, prefix=base.prefix, source=base.source),
        training_file=DataFileRef(file_id="", key=""), validation_file=None, method=POOL_METHOD,
        training_type="lora", lora=LoraConfig(), hyperparameters=Hyperparameters(), checkpoint=CheckpointPolicy(),
        storage_url=trainer_storage_url(settings, job.job_id), callback_url=settings.resolved_public_url,
        job_token=token,
        gpus=job.resolved.gpus, heartbeat_interval_s=settings.heartbeat_interval_s,
        preempt_grace_s=settings.preempt_grace_s,
        cache_dir=str(layout.home_base_model_cache_dir(settings.home).resolve()), extra=dict(job.resolved.extra))
