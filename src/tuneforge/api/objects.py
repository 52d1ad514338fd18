"""Rows -> API objects, in OpenAI's exact shapes (plus documented extensions)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict
from typing import Any

from tuneforge.db.tables import (
    BaseModelRow,
    Checkpoint,
    FileRow,
    FineTunedModel,
    Job,
    JobEvent,
    UploadPartRow,
    UploadRow,
)
from tuneforge.domain.job_config import BLOCK_FIELDS
from tuneforge.domain.status import JobStatus
from tuneforge.registry import parents
from tuneforge.registry.models import evaluated
from tuneforge.services.datasets import processing


def file_object(row: FileRow) -> dict[str, Any]:
    return {
        "id": row.file_id,
        "object": "file",
        "bytes": row.size_bytes,
        "created_at": row.created_at,
        "filename": row.filename,
        "purpose": row.purpose,
        "status": row.status,
        "status_details": row.status_details,
        "expires_at": row.expires_at,
        "sha256": row.sha256,
        "validation": processing.progress_of(row),
    }


def upload_object(row: UploadRow, file: FileRow | None) -> dict[str, Any]:
    return {
        "id": row.upload_id,
        "object": "upload",
        "bytes": row.size_bytes,
        "created_at": row.created_at,
        "filename": row.filename,
        "purpose": row.purpose,
        "status": row.status,
        "expires_at": row.expires_at,
        "file": None if file is None else file_object(file),
        # extensions: what arrived so far (a client resuming sends the rest)
        "mime_type": row.mime_type,
        "received_bytes": row.received_bytes,
    }


def upload_part_object(row: UploadPartRow) -> dict[str, Any]:
    return {"id": row.part_id, "object": "upload.part", "created_at": row.created_at, "upload_id": row.upload_id,
            "bytes": row.size_bytes}  # bytes: an extension


def _hyperparameters(job: Job) -> dict[str, Any]:
    """Resolved values once validation ran; before that, what was asked ('auto')."""
    if job.resolved is not None:
        return job.resolved.hyperparameters.flat()
    requested = job.request.asked_hyperparameters
    keys = ("n_epochs", "batch_size", "learning_rate_multiplier")
    return {key: requested.get(key, "auto") for key in keys} | {
        k: v for k, v in requested.items() if k not in keys
    }


def _training_type(job: Job) -> dict[str, Any]:
    """As asked; with the resolved adapter settings once validation ran."""
    training_type = {"type": "lora", **(job.request.to_json().get("training_type") or {})}
    if job.resolved is not None and training_type["type"] != "full":
        lora = job.resolved.lora
        training_type.update(rank=lora.rank, alpha=lora.alpha, dropout=lora.dropout,
                             target_modules=lora.target_modules)
    return training_type


def shown_status(job: Job, strict: bool = True) -> str:
    """`status` as /v1 shows it. Strict (TUNEFORGE_OPENAI_STRICT_STATUS, the default): within
    OpenAI's values (validating_files, queued, running, pausing, paused, succeeded, failed,
    cancelled), the eval of a trained model being part of `running`."""
    if not strict:
        return job.status
    if job.status in (JobStatus.RUNNING.value, JobStatus.EVALUATING.value):
        return "pausing" if job.pause_requested else JobStatus.RUNNING.value
    return job.status


def job_object(job: Job, strict: bool = True) -> dict[str, Any]:
    hp = _hyperparameters(job)
    summary = {key: hp.get(key, "auto") for key in ("batch_size", "learning_rate_multiplier", "n_epochs")}
    method = job.request.method_type
    # a grader (and a response format) sit in the method block beside its hyperparameters, as OpenAI shows them
    block = {name: value for name in BLOCK_FIELDS if (value := hp.pop(name, None)) is not None}
    resolved = job.resolved
    return {
        "id": job.job_id,
        "object": "fine_tuning.job",
        "created_at": job.created_at,
        "error": job.error,
        "fine_tuned_model": job.fine_tuned_model,
        "finished_at": job.finished_at,
        "hyperparameters": summary,
        "model": job.request.model,  # as asked: a base model, or the fine-tuned model it continues
        "organization_id": job.tenant_id,
        "result_files": list(job.result_files or []),
        "seed": job.seed,
        "status": shown_status(job, strict),
        "trained_tokens": job.trained_tokens,
        "training_file": job.training_file,
        "validation_file": job.validation_file,
        "estimated_finish": job.estimated_finish,
        "integrations": [item.model_dump(mode="json", exclude_none=True) for item in job.request.integrations or []],
        "metadata": job.user_metadata,
        "method": {"type": method, method: {**block, "hyperparameters": hp}},
        "user_provided_suffix": job.suffix,
        # extensions
        "precise_status": job.status,
        "parent": parents.shown(job.parent),
        "training_type": _training_type(job),
        "attempt": job.attempt,
        "checkpointing": asdict(resolved.checkpoint) if resolved is not None else None,
        "divergence": asdict(resolved.divergence) if resolved is not None and resolved.divergence else None,
        "base_model_sha256": job.base_model_sha256,
        "estimate": asdict(resolved.estimate) if resolved is not None and resolved.estimate else None,
        "data": _data_summary(job),
        "eval": _eval_config(job),
        "eval_results": job.eval_results,
        "config_hash": job.config_hash,
    }


def _eval_config(job: Job) -> dict[str, Any] | None:
    if job.resolved is None or job.resolved.eval is None:
        return None
    shown = job.resolved.eval.to_json()
    del shown["task_file_key"]  # a storage key is not the tenant's business
    shown.pop("benchmark_dir", None)  # nor the operator's folder
    return shown


def _data_summary(job: Job) -> dict[str, Any] | None:
    if job.resolved is None:
        return job.request.to_json().get("data")  # the options as asked
    data = job.resolved.data
    return {"dataset_id": data.dataset_id, "train_examples": data.train_examples,
            "valid_examples": data.valid_examples, "train_tokens": data.train_tokens,
            "remove_duplicates": data.remove_duplicates, "validation_split": data.validation_split,
            "pii_policy": data.pii_policy, "long_examples": data.long_examples}


def event_object(event: JobEvent) -> dict[str, Any]:
    return {
        "id": event.event_id,
        "object": "fine_tuning.job.event",
        "created_at": event.created_at,
        "level": event.level,
        "message": event.message,
        "data": event.data or {},
        "type": event.event_type,
    }


def checkpoint_object(row: Checkpoint, job: Job, tenant_name: str) -> dict[str, Any]:
    name = parents.checkpoint_name(job, tenant_name, row.step)
    return {
        "id": row.checkpoint_id,
        "object": "fine_tuning.job.checkpoint",
        "created_at": row.created_at,
        "fine_tuned_model_checkpoint": name,
        "fine_tuning_job_id": row.job_id,
        "metrics": row.metrics,
        "step_number": row.step,
        "epoch": row.epoch,  # extension: the epoch this checkpoint ends; null mid-epoch
    }


def base_model_object(row: BaseModelRow) -> dict[str, Any]:
    return {"id": row.name, "object": "model", "created": row.created_at, "owned_by": "tuneforge",
            "type": "base", "sha256": row.sha256}


def fine_tuned_model_object(row: FineTunedModel) -> dict[str, Any]:
    lineage = dict(row.lineage or {})
    if "artifact" in lineage:  # the digests stay; the storage prefix is the platform's business
        lineage["artifact"] = {"files": lineage["artifact"].get("files")}
    gates = row.gate_report or {}
    return {"id": row.model_id, "object": "model", "created": row.created_at, "owned_by": row.tenant_id,
            # extensions
            "type": "fine-tuned", "base_model": row.base_model, "job_id": row.job_id,
            "artifact": row.artifact_kind, "stage": row.stage, "evaluated": evaluated(row),
            "promotable": bool(row.promotable and evaluated(row)),
            "gate_failures": [g.get("reason") for g in gates.get("gates", []) if not g.get("passed")],
            "suggestions": gates.get("suggestions", []),
            "eval_results": row.eval_results, "gates": gates.get("gates"),
            # the same gates against the lineage's production model (registry/champion.py)
            "champion": gates.get("champion"), "lineage": lineage,
            "config_hash": row.config_hash, "deprecated": row.deprecated_at is not None,
            "delete_after": row.delete_after}


def list_object(items: Iterable[Any], present: Callable[[Any], dict[str, Any]], has_more: bool) -> dict[str, Any]:
    data = [present(item) for item in items]
    return {
        "object": "list",
        "data": data,
        "has_more": has_more,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
    }
