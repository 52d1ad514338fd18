"""A tiny base model in a local object store, and JobSpecs that train it.

`build_model_once` builds the demo's random Llama once per test session;
`stage_job` puts it and the data files into an `FsspecStore` and returns a
ready-to-run `JobSpec`.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tuneforge.demo.dataset import demo_examples
from tuneforge.demo.tiny_model import build_tiny_model
from tuneforge.domain.spec import (
    BaseModelRef,
    CheckpointPolicy,
    DataFileRef,
    Hyperparameters,
    JobSpec,
    LoraConfig,
)
from tuneforge.storage import layout
from tuneforge.storage.store import FsspecStore, open_store

BASE_MODEL_NAME = "tiny-llama"
BASE_MODEL_SHA = "0" * 64
TENANT_ID = "tenant-a"


def build_model_once(factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(factory.mktemp("tiny-model") / "model", seed=0)


def jsonl_bytes(records: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(record) + "\n" for record in records).encode()


def stage_job(
    root: Path,
    model_dir: Path,
    *,
    training: list[dict[str, Any]] | bytes | None = None,
    validation: list[dict[str, Any]] | bytes | None = None,
    hyperparameters: dict[str, Any] | None = None,
    lora: dict[str, Any] | None = None,
    checkpoint: dict[str, Any] | None = None,
    job_id: str = "ftjob-1",
    attempt: int = 1,
    callback_url: str = "http://127.0.0.1:9",
    extra: dict[str, Any] | None = None,
) -> tuple[JobSpec, FsspecStore]:
    """Store (at `root/objects`) holding the base model and data, and the spec of a job on them."""
    store = open_store(str(root / "objects"))
    model_prefix = layout.base_model_prefix(BASE_MODEL_NAME, BASE_MODEL_SHA)
    if not store.exists(f"{model_prefix}/config.json"):
        store.upload_dir(model_dir, model_prefix)
    training = demo_examples(n_keys=12) if training is None else training
    train_key = layout.file_key(TENANT_ID, "file-train", "train.jsonl")
    store.put_bytes(train_key, training if isinstance(training, bytes) else jsonl_bytes(training))
    validation_ref = None
    if validation is not None:
        valid_key = layout.file_key(TENANT_ID, "file-valid", "valid.jsonl")
        store.put_bytes(valid_key, validation if isinstance(validation, bytes) else jsonl_bytes(validation))
        validation_ref = DataFileRef("file-valid", valid_key)
    hp = {"n_epochs": 2, "batch_size": 4, "micro_batch_size": 4, "learning_rate": 1e-2,
          "warmup_ratio": 0.0, "max_seq_length": 128, **(hyperparameters or {})}
    spec = JobSpec(
        job_id=job_id,
        tenant_id=TENANT_ID,
        attempt=attempt,
        seed=0,
        base_model=BaseModelRef(BASE_MODEL_NAME, BASE_MODEL_SHA, model_prefix, source=str(model_dir)),
        training_file=DataFileRef("file-train", train_key),
        validation_file=validation_ref,
        method="supervised",
        training_type="lora",
        lora=LoraConfig(**{"rank": 8, "alpha": 16, **(lora or {})}),
        hyperparameters=Hyperparameters.from_dict(hp),
        checkpoint=CheckpointPolicy(**{"every_steps": 100, "keep_last": 3, **(checkpoint or {})}),
        storage_url=str(root / "objects"),
        callback_url=callback_url,
        job_token="job-token-1",
        heartbeat_interval_s=0.2,
        cache_dir=str(root / "cache"),
        extra=dict(extra or {}),
    )
    return spec, store


def next_attempt(spec: JobSpec, **changes: Any) -> JobSpec:
    """The same job's next attempt (test hooks dropped unless given again)."""
    return replace(spec, attempt=spec.attempt + 1, extra=changes.pop("extra", {}), **changes)
