"""Every object-store key tuneforge uses is built here and nowhere else, and so is
every folder of a host's local caches.

tenants/{tenant}/files/{file_id}/{filename}
tenants/{tenant}/uploads/{upload_id}/{part_id}       an Upload's parts, until it completes or ends
tenants/{tenant}/datasets/{dataset_id}/...
tenants/{tenant}/jobs/{job_id}/checkpoints/step-{n}/...
tenants/{tenant}/jobs/{job_id}/artifacts/{adapter|merged|model}/...
tenants/{tenant}/jobs/{job_id}/results.csv
tenants/{tenant}/jobs/{job_id}/logs/attempt-{n}.log  the trainer's output, scrubbed, its newest MiB
base-models/{name}/{sha}/...
admin/tenant-exports/{tenant}/{unix time}.json       what a deleted tenant had, written before its deletion

Local caches (a host's folders, not keys):

{TUNEFORGE_HOME}/cache/base-models/{sha}/...     base models copied from the store
{TUNEFORGE_HOME}/cache/artifacts/{hash}/...      registered artifacts copied for serving
{TUNEFORGE_HOME}/cache/hub/...                   hub downloads of a base model being registered
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

_SAFE = re.compile(r"[^A-Za-z0-9._-]+")
# A whole last segment "step-N": "laststep-3" or "step-3.tmp" are not checkpoints.
CHECKPOINT_DIR = re.compile(r"(?:^|/)step-(\d+)$")
MANIFEST_NAME = "manifest.json"
TRAINER_STATE_NAME = "trainer_state.json"  # in a checkpoint: step, data position, history
COMPLETE_NAME = ".complete"  # written last into a folder (a merged export, a cached copy): the folder is whole
BASE_MODEL_CONFIG_NAME = "config.json"


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
    return f"{tenant_files_prefix(tenant_id)}/{_part(file_id)}"


def tenant_files_prefix(tenant_id: str) -> str:
    """Every file of the tenant is one folder under this (`file_prefix`)."""
    return f"{tenant_prefix(tenant_id)}/files"


def tenant_file_reports_prefix(tenant_id: str) -> str:
    """Every file validation report of the tenant is one key under this (`file_report_key`)."""
    return f"{tenant_prefix(tenant_id)}/reports/files"


def upload_prefix(tenant_id: str, upload_id: str) -> str:
    return f"{tenant_prefix(tenant_id)}/uploads/{_part(upload_id)}"


def upload_part_key(tenant_id: str, upload_id: str, part_id: str) -> str:
    return f"{upload_prefix(tenant_id, upload_id)}/{_part(part_id)}"


def file_report_key(tenant_id: str, file_id: str) -> str:
    """The validation report of an uploaded file (beside, not inside, its folder)."""
    return f"{tenant_file_reports_prefix(tenant_id)}/{_part(file_id)}.json"


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


def tokenized_prefix(dataset_file_key: str, ident: str) -> str | None:
    """The folder of a prepared dataset file's tokenized shards (`train/token_shards.py`), in the
    same cache folder as `tokenized_key`; None for any other file."""
    key = tokenized_key(dataset_file_key, ident)
    return None if key is None else key.removesuffix(".npz")


def tenant_export_key(tenant_id: str, stamp: int) -> str:
    """The export archive written before tenant `tenant_id` is deleted: operators' data, outside
    every tenant prefix (services/tenancy/deletion.py)."""
    return f"admin/tenant-exports/{_part(tenant_id)}/{int(stamp)}.json"


def eval_sets_prefix() -> str:
    return "eval-sets"


def eval_set_key(name: str, filename: str) -> str:
    return f"{eval_sets_prefix()}/{_part(name)}/{_part(filename)}"


def dataset_prefix(tenant_id: str, dataset_id: str) -> str:
    return f"{tenant_prefix(tenant_id)}/datasets/{_part(dataset_id)}"


def tenant_jobs_prefix(tenant_id: str) -> str:
    """Everything the tenant's jobs wrote: checkpoints, artifacts, copied parents, tracking files."""
    return f"{tenant_prefix(tenant_id)}/jobs"


def job_prefix(tenant_id: str, job_id: str) -> str:
    return f"{tenant_jobs_prefix(tenant_id)}/{_part(job_id)}"


def parent_adapter_prefix(tenant_id: str, job_id: str) -> str:
    """The copy of the adapter a job continues from (its parent's, taken when the job was created)."""
    return f"{job_prefix(tenant_id, job_id)}/parent-adapter"


def trainer_log_key(tenant_id: str, job_id: str, attempt: int) -> str:
    """The trainer's output of one attempt, scrubbed and cut to its newest part
    (services/training/trainer_logs.py)."""
    return f"{job_prefix(tenant_id, job_id)}/logs/attempt-{int(attempt)}.log"


def tensorboard_prefix(tenant_id: str, job_id: str) -> str:
    """A job's TensorBoard event files (its `tensorboard` integration)."""
    return f"{job_prefix(tenant_id, job_id)}/tensorboard"


def wandb_prefix(tenant_id: str, job_id: str) -> str:
    """A job's W&B offline run files (its `wandb` integration where the operator runs W&B offline)."""
    return f"{job_prefix(tenant_id, job_id)}/wandb"


def checkpoints_prefix(tenant_id: str, job_id: str) -> str:
    return f"{job_prefix(tenant_id, job_id)}/checkpoints"


def checkpoint_prefix(tenant_id: str, job_id: str, step: int) -> str:
    return f"{checkpoints_prefix(tenant_id, job_id)}/step-{int(step)}"


def checkpoint_file_key(checkpoint: str, name: str) -> str:
    """One file of the checkpoint at prefix `checkpoint` (weights, optimizer, RNG, trainer state)."""
    return f"{checkpoint.rstrip('/')}/{_part(name)}"


def checkpoint_manifest_key(checkpoint: str) -> str:
    """The manifest of the checkpoint at prefix `checkpoint`, written last."""
    return checkpoint_file_key(checkpoint, MANIFEST_NAME)


def trainer_state_key(checkpoint: str) -> str:
    """The trainer state (step, data position, history) inside the checkpoint folder `checkpoint`."""
    return f"{checkpoint}/{TRAINER_STATE_NAME}"


def checkpoint_step(prefix: str) -> int | None:
    """The step of a checkpoint folder key, or None if it is not one."""
    match = CHECKPOINT_DIR.search(prefix.rstrip("/"))
    return int(match.group(1)) if match else None


def artifact_prefix(tenant_id: str, job_id: str, kind: str) -> str:
    if kind not in ("adapter", "merged", "model"):  # model: the weights of a full fine-tune
        raise ValueError(f"unknown artifact kind {kind!r}")
    return f"{job_prefix(tenant_id, job_id)}/artifacts/{kind}"


def checkpoint_model_prefix(tenant_id: str, job_id: str, step: int) -> str:
    """The adapter of a checkpoint registered as a model: a copy, since checkpoints are pruned."""
    return f"{job_prefix(tenant_id, job_id)}/artifacts/checkpoint-models/step-{int(step)}"


def merged_prefix(tenant_id: str, job_id: str, dtype: str) -> str:
    """Base + adapter merged into full weights of `dtype` (built on first download, then kept)."""
    if dtype not in ("bf16", "fp16", "fp32"):
        raise ValueError(f"unknown merged dtype {dtype!r}")
    return f"{artifact_prefix(tenant_id, job_id, 'merged')}/{dtype}"


def registered_model_prefix(tenant_id: str, tag: str) -> str:
    """A model registered from a training-API checkpoint (no job made it): its adapter, a copy,
    so that deleting the checkpoint or its run cannot take the model's weights away."""
    return f"{tenant_prefix(tenant_id)}/registered-models/{_part(tag)}"


def complete_marker_key(prefix: str) -> str:
    """The marker written last into a folder of keys built in several writes (a merged
    export): without it the folder is unfinished."""
    return f"{prefix}/{COMPLETE_NAME}"


def eval_base_results_key(base_sha256: str, suite_sha256: str) -> str:
    """A base model's results on a platform eval suite, computed once and shared by every job."""
    return f"eval-cache/{_part(base_sha256)}/{_part(suite_sha256)}.json"


def results_key(tenant_id: str, job_id: str) -> str:
    return f"{job_prefix(tenant_id, job_id)}/results.csv"


def base_model_prefix(name: str, sha256: str) -> str:
    return f"base-models/{_part(name)}/{_part(sha256)}"


def base_model_config_key(base_prefix: str) -> str:
    """The model's config.json inside a registered base model's folder (`base_model_prefix`)."""
    return f"{base_prefix}/{BASE_MODEL_CONFIG_NAME}"


# ---- a host's local caches ----------------------------------------------------------------------
def local_cache_dir(home: Path) -> Path:
    """The caches of a control plane (and of the trainers its local executor starts) under its home."""
    return Path(home) / "cache"


def base_model_cache_dir(cache_dir: Path) -> Path:
    """Base models copied from the store under a cache folder, one folder per SHA."""
    return Path(cache_dir) / "base-models"


def home_base_model_cache_dir(home: Path) -> Path:
    """The base-model cache of the control plane at `home`: its tokenizers, its merges, and
    the trainers its local executor starts on this host."""
    return base_model_cache_dir(local_cache_dir(home))


def default_base_model_cache_dir() -> Path:
    """Where a trainer whose spec names no cache folder keeps base models."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tuneforge" / "base-models"


def cached_base_model_dir(base_model_cache: Path, sha256: str) -> Path:
    """The copy of the base model with this SHA in a base-model cache folder."""
    return Path(base_model_cache) / sha256


def artifact_cache_dir(cache_dir: Path, artifact_prefix: str) -> Path:
    """A registered artifact copied from the store (artifacts are immutable once
    registered, so their prefix names the content)."""
    return Path(cache_dir) / "artifacts" / hashlib.sha256(artifact_prefix.encode()).hexdigest()[:32]


def hub_cache_dir(cache_dir: Path) -> Path:
    """Downloads from the Hugging Face hub when a base model is registered by its hub id."""
    return Path(cache_dir) / "hub"


def training_runs_prefix(tenant_id: str) -> str:
    """The tenant's training-API runs (models trained through /tinker), one folder each."""
    return f"{tenant_prefix(tenant_id)}/training-runs"


def training_run_key(tenant_id: str, run_id: str) -> str:
    """The run's record (its id, base model, LoRA shape, times) as JSON."""
    return f"{training_runs_prefix(tenant_id)}/{_part(run_id)}/run.json"


def training_checkpoint_prefix(tenant_id: str, run_id: str, kind: str, name: str) -> str:
    """One saved checkpoint of a run: `kind` weights (training state) or sampler_weights."""
    return f"{training_runs_prefix(tenant_id)}/{_part(run_id)}/{_part(kind)}/{_part(name)}"


def training_state_key(tenant_id: str, name: str) -> str:
    """Where a training-API model's (or sampler's) state is kept while no worker holds it: released
    when idle, or its worker preempted."""
    return f"{training_runs_prefix(tenant_id)}/_kept/{_part(name)}.pt"
