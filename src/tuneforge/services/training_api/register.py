"""A training-API checkpoint registered as a fine-tuned model (`POST /v1/models`, blocking: call
from a thread).

The model is then like any other `ft:` model of the tenant's: `/v1/chat/completions` runs it, an
ordinary job continues it (its adapter's rank, alpha and target modules kept), `GET
/v1/models/{id}/download` gives its adapter in PEFT's format, and it is promoted through the
registry's stages. Its name is `ft:{base}:{tenant}:{suffix}:{tag}` as a job's model's, `tag` eight
random characters. Registering the same checkpoint again (same path, same save) answers the model
it made; a checkpoint overwritten since makes a new one.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from typing import Any

from sqlalchemy.orm import Session

from tuneforge.db.repos import base_models as base_model_repo
from tuneforge.db.repos import models as model_repo
from tuneforge.db.tables import FineTunedModel, Tenant
from tuneforge.domain.errors import ApiError, invalid
from tuneforge.registry import models as registry
from tuneforge.registry.parents import TAG_CHARS
from tuneforge.services.training_api import runs
from tuneforge.storage import layout

_SUFFIX = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_TAG_ALPHABET = string.ascii_lowercase + string.digits
MAX_ADAPTER_CONFIG_BYTES = 64 * 1024


def register(session: Session, platform: Any, tenant: Tenant, source: str, suffix: str | None) -> FineTunedModel:
    if suffix is not None and not _SUFFIX.match(suffix):
        raise invalid("suffix may use up to 64 letters, digits, '-', '_' and '.'", param="suffix")
    store = platform.store
    record, prefix = runs.checkpoint_at(store, tenant.tenant_id, source, "source")
    for row in model_repo.without_job(session, tenant.tenant_id):
        seen = row.lineage or {}
        if seen.get("checkpoint") == record["tinker_path"] \
                and seen.get("checkpoint_time") == record.get("time") and row.artifacts_deleted_at is None:
            return row
    base = base_model_repo.by_name(session, str(record.get("base_model")))
    sha = record.get("base_sha256") or (base.sha256 if base is not None else None)
    if base is None or base.sha256 != sha:
        raise ApiError(409, f"{source} was trained on {record.get('base_model')} as it was then; that base model has "
                            "been removed or replaced since", param="source", code="base_model_gone")
    adapter = _adapter_settings(store, prefix)
    model_id, tag = _free_name(session, base.name, tenant.name, suffix)
    return registry.register_training_checkpoint(
        session, store, tenant_id=tenant.tenant_id, model_id=model_id,
        base={"name": base.name, "sha256": base.sha256}, source=record, source_prefix=prefix,
        target_prefix=layout.registered_model_prefix(tenant.tenant_id, tag), adapter=adapter)


def _adapter_settings(store: Any, prefix: str) -> dict[str, Any]:
    """The adapter's LoRA settings, as a job's lineage and a continuing job read them."""
    raw = store.get_bytes(f"{prefix}/adapter_config.json")
    if len(raw) > MAX_ADAPTER_CONFIG_BYTES:
        raise ValueError("adapter_config.json is larger than any this platform writes")
    config = json.loads(raw)
    alpha = float(config["lora_alpha"])
    return {"rank": int(config["r"]), "alpha": int(alpha) if alpha.is_integer() else alpha,
            "dropout": float(config.get("lora_dropout", 0.0)), "target_modules": list(config["target_modules"])}


def _free_name(session: Session, base: str, tenant_name: str, suffix: str | None) -> tuple[str, str]:
    for _ in range(8):
        tag = "".join(secrets.choice(_TAG_ALPHABET) for _ in range(TAG_CHARS))
        model_id = f"ft:{base}:{tenant_name}:{suffix or ''}:{tag}"
        if model_repo.any_tenants(session, model_id) is None:
            return model_id, tag
    raise RuntimeError("no free model name after 8 draws")
