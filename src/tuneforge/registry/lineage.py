"""Lineage of a fine-tuned model: everything needed to trace it to its inputs
and to tell whether two jobs would train the same weights.

The configuration hash covers what determines the trained weights — base
model SHA, the content hashes of the data files, method, training type, the
resolved hyperparameters and LoRA settings, and the seed — and nothing that
does not (job id, suffix, metadata, GPU count)."""

from __future__ import annotations

import functools
import hashlib
import json
import subprocess
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tuneforge import __version__
from tuneforge.db.tables import FileRow, Job
from tuneforge.domain.resolved import ResolvedJob
from tuneforge.registry import parents
from tuneforge.storage.store import ObjectStore


def _canonical_sha256(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _trained_settings(resolved: ResolvedJob | None) -> dict[str, Any]:
    """The resolved hyperparameters and LoRA settings as the hashes and the lineage show them."""
    if resolved is None:
        return {"hyperparameters": None, "lora": None}
    return {"hyperparameters": resolved.hyperparameters.flat(), "lora": asdict(resolved.lora)}


def hyperparameters_hash(resolved: ResolvedJob | None) -> str:
    """SHA-256 of the resolved hyperparameters and LoRA settings (canonical JSON)."""
    return _canonical_sha256(_trained_settings(resolved))


def config_hash(job: Job, training: FileRow, validation: FileRow | None) -> str:
    request = job.request
    return _canonical_sha256({
        "base_model_sha256": job.base_model_sha256,
        "training_file_sha256": training.sha256,
        "validation_file_sha256": validation.sha256 if validation else None,
        "method": request.method_type,
        "training_type": request.training_type_kind,
        "hyperparameters": hyperparameters_hash(job.resolved),
        "data": request.to_json().get("data") or {},  # the data options as the tenant gave them
        "seed": job.seed,
        # where the weights started: a continued job's parent (absent for a fresh adapter)
        **({"parent": parents.shown(job.parent)} if job.parent else {}),
    })


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """The package version, and the git commit when running from a checkout."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=Path(__file__).parent,
                                capture_output=True, text=True, timeout=5, check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return f"{__version__}+g{commit}" if commit else __version__


def artifact_digests(store: ObjectStore, prefix: str) -> dict[str, str]:
    """SHA-256 of every file of a registered artifact, by its path under the prefix: what
    makes a registered artifact checkably immutable."""
    strip = len(prefix.rstrip("/")) + 1
    digests = {}
    for key in sorted(store.list(prefix)):
        digest = hashlib.sha256()
        with store.open_read(key) as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
        digests[key[strip:]] = digest.hexdigest()
    return digests


def build_lineage(job: Job, training: FileRow | None, validation: FileRow | None, *, attempts: int,
                  artifact_prefix: str, artifact_files: dict[str, str]) -> dict[str, Any]:
    resolved, request = job.resolved, job.request

    def file_entry(row: FileRow | None, file_id: str | None) -> dict[str, Any] | None:
        if file_id is None:
            return None
        return {"id": file_id, "sha256": row.sha256 if row else None, "filename": row.filename if row else None}

    return {
        "base_model": {"name": job.model, "sha256": job.base_model_sha256},
        "training_file": file_entry(training, job.training_file),
        "validation_file": file_entry(validation, job.validation_file),
        "dataset_id": resolved.data.dataset_id if resolved is not None else None,
        "method": request.method_type,
        "training_type": request.training_type_kind,
        **_trained_settings(resolved),
        "hyperparameters_sha256": hyperparameters_hash(resolved),
        "config_hash": job.config_hash,
        "seed": job.seed,
        "job_id": job.job_id,
        "suffix": job.suffix,  # with the base model, the lineage a production model champions (registry/champion.py)
        "attempts": attempts,
        "trained_tokens": job.trained_tokens,
        "code_version": code_version(),
        "artifact": {"prefix": artifact_prefix, "files": artifact_files},
        # the fine-tuned model or checkpoint this job continued from (its own lineage has its parent)
        "parent": parents.shown(job.parent),
    }
