"""Fine-tuned models registered straight into the registry, for tests of what serves them."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from tuneforge.db.tables import BaseModelRow, FineTunedModel, Job, Tenant
from tuneforge.domain.job_config import JobRequest
from tuneforge.storage import layout
from tuneforge.storage.store import ObjectStore


def add_adapter_model(session: Session, store: ObjectStore, tenant: Tenant, base: BaseModelRow, name: str,
                      adapter_dir: Path, **fields: Any) -> str:
    """A succeeded job of `tenant` on `base` and its model `ft:BASE:TENANT:NAME:…` whose adapter
    is `adapter_dir` (uploaded to where a trained one would be); `fields` set the model row's
    columns (stage, promotable, gate_report, ...); by default it was evaluated and passed its gates.
    Returns the model id."""
    fields.setdefault("eval_results", {"base": {}, "fine_tuned": {}})
    fields.setdefault("gate_report", {"passed": True, "gates": [], "suggestions": []})
    now = int(time.time())
    job_id = f"ftjob-{name}"
    session.add(Job(job_id=job_id, tenant_id=tenant.tenant_id, model=base.name, base_model_sha256=base.sha256,
                    training_file="file-train", status="succeeded", seed=0,
                    request=JobRequest(model=base.name, training_file="file-train"), request_hash="0" * 64,
                    created_at=now))
    session.flush()
    prefix = layout.artifact_prefix(tenant.tenant_id, job_id, "adapter")
    store.upload_dir(adapter_dir, prefix)
    model_id = f"ft:{base.name}:{tenant.name}:{name}:{job_id[-6:]}"
    session.add(FineTunedModel(model_id=model_id, tenant_id=tenant.tenant_id, job_id=job_id, base_model=base.name,
                               base_model_sha256=base.sha256, artifact_prefix=prefix, created_at=now,
                               artifact_kind="adapter", **fields))
    session.flush()
    return model_id
