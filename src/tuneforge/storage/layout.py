"""Every object-store key tuneforge uses is built here and nowhere else.

tenants/{tenant}/files/{file_id}/{filename}
tenants/{tenant}/datasets/{dataset_id}/...
tenants/{tenant}/jobs/{job_id}/checkpoints/step-{n}/...
tenants/{tenant}/jobs/{job_id}/artifacts/{adapter|merged|model}/...
tenants/{tenant}/jobs/{job_id}/results.csv
base-models/{name}/{sha}/...
"""

from __future__ import annotations

import re

_SAFE = re.compile(r"[^A-Za-z0-9._-]+")
# A whole last segment "step-N": "laststep-3" or "step-3.tmp" are not checkpoints.
CHECKPOINT_DIR = re.compile(r"(?:^|/)step-(\d+)$")
MANIFEST_NAME = "manifest.json"
TRAINER_STATE_NAME = "trainer_state.json"  # in a checkpoint: step, data position, history


def _part(value: str) -> str:
    """One path segment: no slashes, no dot-dot, never empty."""
    cleaned = _SAFE.sub("_", value).strip(".")
    if not cleaned:
        raise ValueError(f"cannot use {value!r} in an object key")
    return cleaned


def tenant_prefix(tenant_id: str) -> str:
    return f"tenants/{_part(tenant_id)}"


def file_key(tenant_id: str, file_id: str, filename: str) -> str:
    return f"{tenant_prefix(tenant_id)}/files/{_part(file_id)}/{_part(filename)}"


def file_prefix(tenant_id: str, file_id: str) -> str:
    return f"{tenant_prefix(tenant_id)}/files/{_part(file_id)}"


def file_report_key(tenant_id: str, file_id: str) -> str:
    """The validation report of an uploaded file (beside, not inside, its folder)."""
    return f"{tenant_prefix(tenant_id)}/reports/files/{_part(file_id)}.json"


def job_report_key(tenant_id: str, job_id: str) -> str:
    return f"{job_prefix(tenant_id, job_id)}/validation.json"


def dataset_key(tenant_id: str, dataset_id: str, name: str) -> str:
    """A file of a prepared (normalised) dataset: train.jsonl, valid.jsonl, manifest.json."""
    return f"{dataset_prefix(tenant_id, dataset_id)}/{_part(name)}"


def reference_logps_key(data_file_key: str, ident: str) -> str:
    """Reference-model log-probabilities of a preference file's answers, beside the file
    (`ident` names the base model, max_seq_length and what was scored)."""
    return f"{data_file_key}.reference-logps-{ident}.npy"


def tokenized_key(dataset_file_key: str, ident: str) -> str | None:
    """Tokenized cache beside a prepared dataset file; None for any other file
    (only prepared datasets are content-addressed, so only they can be cached)."""
    folder, _, name = dataset_file_key.rpartition("/")
    if "/datasets/ds-" not in f"/{folder}":
        return None
    return f"{folder}/tokenized/{_part(name)}-{_part(ident)}.npz"


def eval_sets_prefix() -> str:
    return "eval-sets"


def eval_set_key(name: str, filename: str) -> str:
    return f"{eval_sets_prefix()}/{_part(name)}/{_part(filename)}"


def dataset_prefix(tenant_id: str, dataset_id: str) -> str:
    return f"{tenant_prefix(tenant_id)}/datasets/{_part(dataset_id)}"


def job_prefix(tenant_id: str, job_id: str) -> str:
    return f"{tenant_prefix(tenant_id)}/jobs/{_part(job_id)}"


def checkpoints_prefix(tenant_id: str, job_id: str) -> str:
    return f"{job_prefix(tenant_id, job_id)}/checkpoints"


def checkpoint_prefix(tenant_id: str, job_id: str, step: int) -> str:
    return f"{checkpoints_prefix(tenant_id, job_id)}/step-{int(step)}"


def checkpoint_step(prefix: str) -> int | None:
    """The step of a checkpoint folder key, or None if it is not one."""
    match = CHECKPOINT_DIR.search(prefix.rstrip("/"))
    return int(match.group(1)) if match else None


def artifact_prefix(tenant_id: str, job_id: str, kind: str) -> str:
    if kind not in ("adapter", "merged", "model"):  # model: the weights of a full fine-tune
        raise ValueError(f"unknown artifact kind {kind!r}")
    return f"{job_prefix(tenant_id, job_id)}/artifacts/{kind}"


def merged_prefix(tenant_id: str, job_id: str, dtype: str) -> str:
    """Base + adapter merged into full weights of `dtype` (built on first download, then kept)."""
    if dtype not in ("bf16", "fp16", "fp32"):
        raise ValueError(f"unknown merged dtype {dtype!r}")
    return f"{artifact_prefix(tenant_id, job_id, 'merged')}/{dtype}"


def eval_base_results_key(base_sha256: str, suite_sha256: str) -> str:
    """A base model's results on a platform eval suite, computed once and shared by every job."""
    return f"eval-cache/{_part(base_sha256)}/{_part(suite_sha256)}.json"


def results_key(tenant_id: str, job_id: str) -> str:
    return f"{job_prefix(tenant_id, job_id)}/results.csv"


def base_model_prefix(name: str, sha256: str) -> str:
    return f"base-models/{_part(name)}/{_part(sha256)}"
