"""Downloadable artifacts: a job's final adapter or one checkpoint's adapter,
packed as a tar.gz of a folder that `PeftModel.from_pretrained` loads."""

from __future__ import annotations

import os
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from sqlalchemy.orm import Session

from tuneforge.db.repos import base_models as base_model_repo
from tuneforge.db.repos import checkpoints as checkpoint_repo
from tuneforge.db.repos import jobs as job_repo
from tuneforge.db.tables import FineTunedModel, Job
from tuneforge.domain.errors import ApiError, invalid, not_found
from tuneforge.domain.status import JobStatus
from tuneforge.registry import parents
from tuneforge.services.context import Platform
from tuneforge.storage import layout
from tuneforge.storage.store import ObjectStore

_ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin", "README.md",
                  "tuneforge.json")
_MODEL_FILES = ("model.safetensors",)


def _archive(store: ObjectStore, prefix: str, folder: str, keep: tuple[str, ...] | None) -> IO[bytes]:
    keys = store.list(prefix)
    if keep is not None:  # a checkpoint: its weights, not the optimizer and trainer state
        keys = [k for k in keys if k.rsplit("/", 1)[-1] in keep]
    if not keys:
        raise not_found("the artifact has no files", param="artifact", code="artifact_not_found")
    spool = tempfile.TemporaryFile()
    strip = len(prefix.rstrip("/")) + 1
    with tarfile.open(fileobj=spool, mode="w:gz") as tar:
        for key in keys:
            size = store.size_bytes(key)
            info = tarfile.TarInfo(name=f"{folder}/{key[strip:]}")
            info.size = size
            info.mode = 0o644
            with store.open_read(key) as handle:
                tar.addfile(info, handle)
    spool.seek(0)
    return spool


_TRACKING = {"tensorboard": layout.tensorboard_prefix, "wandb": layout.wandb_prefix}


def adapter_archive(session: Session, platform: Platform, job: Job, *, artifact: str | None,
                    step: int | None, dtype: str | None = None) -> tuple[str, IO[bytes]]:
    """The job's trained weights as a .tar.gz: the adapter (LoRA, QLoRA), or the whole
    model (a full fine-tune: `artifact=model`); `step=N`: a checkpoint's weights;
    `artifact=merged`: base + adapter as full weights of `dtype` (bf16 by default)."""
    store = platform.store
    full = job.request.training_type_kind == "full"
    artifact = artifact or ("model" if full else "adapter")
    if artifact not in ("adapter", "model", "merged") + tuple(_TRACKING):
        raise invalid("artifact must be 'adapter', 'model', 'merged', 'tensorboard' or 'wandb'", param="artifact")
    if artifact in _TRACKING:  # the files of the job's tensorboard integration (or offline wandb run), so far
        if step is not None or dtype is not None:
            raise invalid(f"artifact={artifact} takes neither step nor dtype", param="artifact")
        folder = f"{job.job_id}-{artifact}"
        return f"{folder}.tar.gz", _archive(store, _TRACKING[artifact](job.tenant_id, job.job_id), folder, keep=None)
    if dtype is not None and artifact != "merged":
        raise invalid("dtype applies to artifact=merged only", param="dtype")
    if artifact == "merged":
        if step is not None:
            raise invalid("artifact=merged is built from the final weights; step cannot be given", param="step")
        return _merged_archive(session, store, job, dtype or "bf16", layout.home_base_model_cache_dir(
            platform.settings.home))
    if (artifact == "model") != full:
        kind = "a full fine-tune: its artifact is 'model'" if full else "an adapter: its artifact is 'adapter'"
        raise invalid(f"{job.job_id} is {kind}", param="artifact", code="artifact_not_found")
    if step is not None:
        if not parents.checkpoints_offered(job):
            raise ApiError(409, f"{job.job_id} has failed: a failed job made no model, and its checkpoints are not "
                                "offered as one", param="step", code="job_failed")
        row = checkpoint_repo.at_step(session, job.tenant_id, job.job_id, step)
        if row is None:
            raise not_found(f"{job.job_id} has no checkpoint at step {step}", param="step",
                            code="checkpoint_not_found")
        folder = f"{job.job_id}-step-{step}"
        return f"{folder}.tar.gz", _archive(store, row.prefix, folder, keep=_MODEL_FILES if full else _ADAPTER_FILES)
    if job.status != JobStatus.SUCCEEDED.value:
        raise ApiError(409, f"{job.job_id} is {job.status}; the final adapter exists once it has succeeded "
                            "(pass step=N for a checkpoint)", param="artifact", code="artifact_not_ready")
    prefix = layout.artifact_prefix(job.tenant_id, job.job_id, artifact)
    folder = f"{job.job_id}-{artifact}"
    return f"{folder}.tar.gz", _archive(store, prefix, folder, keep=None)


def model_archive(store: ObjectStore, row: FineTunedModel) -> tuple[str, IO[bytes]]:
    """A registered model's weights as a .tar.gz: its adapter in PEFT's format (a LoRA model, a
    checkpoint or a training-API checkpoint registered as a model), or a full fine-tune's model
    folder. An adapter's files are checked against the digests recorded at registration first
    (a full model's are not: hashing its gigabytes on every download would cost more than it checks)."""
    from tuneforge.registry import models as registry

    if row.artifact_kind == "adapter":
        registry.verify_artifacts(store, row)
    folder = row.model_id.replace(":", "_").replace("/", "_")
    return f"{folder}.tar.gz", _archive(store, row.artifact_prefix, folder,
                                         keep=_ADAPTER_FILES if row.artifact_kind == "adapter" else None)


def _merged_archive(session: Session, store: ObjectStore, job: Job, dtype: str,
                    cache_dir: Path) -> tuple[str, IO[bytes]]:
    from tuneforge.registry import export
    from tuneforge.registry import models as registry

    if dtype not in export.DTYPES:
        raise invalid(f"dtype must be one of {', '.join(export.DTYPES)}", param="dtype")
    if job.status != JobStatus.SUCCEEDED.value or not job.fine_tuned_model:
        raise ApiError(409, f"{job.job_id} is {job.status}; merged weights exist once it has succeeded",
                       param="artifact", code="artifact_not_ready")
    row = registry.get(session, job.tenant_id, job.fine_tuned_model)
    base = base_model_repo.by_name(session, job.model)
    if base is None or base.sha256 != row.base_model_sha256:
        raise ApiError(409, f"the base model {job.model} this adapter was trained on is no longer registered",
                       param="artifact", code="base_model_gone")
    prefix = export.build_merged(store, row, base.sha256, base.prefix, dtype, cache_dir)
    folder = f"{job.job_id}-merged-{dtype}"
    marker = layout.complete_marker_key(prefix)
    keys_kept = tuple(k.rsplit("/", 1)[-1] for k in store.list(prefix) if k != marker)
    return f"{folder}.tar.gz", _archive(store, prefix, folder, keep=keys_kept)


def iter_file(handle: IO[bytes], chunk_bytes: int = 1 << 20) -> Iterator[bytes]:
    with handle:
        while chunk := handle.read(chunk_bytes):
            yield chunk


def extract(archive: Path, into: Path) -> Path:
    """Unpack a downloaded archive safely (no absolute paths, no '..')."""
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar.getmembers():
            target = os.path.normpath(into / member.name)
            if not target.startswith(str(into.resolve())) and not target.startswith(str(into)):
                raise ValueError(f"unsafe path in archive: {member.name}")
        tar.extractall(into, filter="data")
        roots = {m.name.split("/", 1)[0] for m in tar.getmembers()}
    return into / sorted(roots)[0]


def discard_checkpoints(session: Session, store: ObjectStore, job: Job) -> int:
    """A cancelled job's checkpoints, unless its policy keeps them: files and rows. Returns how many."""
    if job.resolved is not None and job.resolved.checkpoint.keep_on_cancel:
        return 0
    rows = checkpoint_repo.for_job(session, job.tenant_id, job.job_id)
    store.delete_prefix(layout.checkpoints_prefix(job.tenant_id, job.job_id))
    for row in rows:
        session.delete(row)
    return len(rows)


def discard_failed(session: Session, store: ObjectStore, now: float, grace_s: float, limit: int = 100) -> int:
    """The checkpoints and final weights of failed jobs, which are not offered to anyone
    (`parents.checkpoints_offered`) and would otherwise be the operator's storage bill forever:
    files and rows, once the job ended `grace_s` ago (its trainer is done writing). Returns how
    many jobs were cleared; a job without checkpoint rows is not looked at again."""
    jobs = job_repo.failed_with_checkpoints(session, now - grace_s, limit)
    for job in jobs:
        for kind in ("adapter", "model"):
            store.delete_prefix(layout.artifact_prefix(job.tenant_id, job.job_id, kind))
        store.delete_prefix(layout.checkpoints_prefix(job.tenant_id, job.job_id))
        for row in checkpoint_repo.for_job(session, job.tenant_id, job.job_id):
            session.delete(row)
    return len(jobs)
