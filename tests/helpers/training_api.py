"""Training-API checkpoints as a worker's save leaves them in the store, without a worker."""

from __future__ import annotations

import json
from typing import Any

from tuneforge.db.repos import base_models as base_model_repo
from tuneforge.db.tables import Tenant
from tuneforge.storage import layout

RUN = "sess-1:train:0"


def tenant_named(platform: Any, name: str) -> str:
    with platform.db.session() as session:
        return session.query(Tenant).filter(Tenant.name == name).one().tenant_id


def saved_training_checkpoint(platform: Any, base_model: str, tenant: str, name: str, *, time: str,
                              base_sha256: str | None = None) -> str:
    """What a worker's `save_weights_for_sampler` writes: the training state, the PEFT adapter
    (placeholder bytes) and the record, last. Its tinker:// path."""
    with platform.db.session() as session:
        sha = base_sha256 or base_model_repo.by_name(session, base_model).sha256
    prefix = layout.training_checkpoint_prefix(tenant, RUN, "sampler_weights", name)
    store = platform.store
    store.put_bytes(f"{prefix}/state.pt", b"state")
    store.put_bytes(f"{prefix}/adapter_model.safetensors", f"weights of {name} at {time}".encode())
    store.put_bytes(f"{prefix}/adapter_config.json", json.dumps(
        {"peft_type": "LORA", "r": 16, "lora_alpha": 32.0, "lora_dropout": 0.0,
         "target_modules": ["k_proj", "q_proj"]}).encode())
    path = f"tinker://{RUN}/sampler_weights/{name}"
    store.put_bytes(f"{prefix}/checkpoint.json", json.dumps(
        {"checkpoint_id": f"sampler_weights/{name}", "checkpoint_type": "sampler", "time": time,
         "tinker_path": path, "run_id": RUN, "base_model": base_model, "base_sha256": sha}).encode())
    return path
