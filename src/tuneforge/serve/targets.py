"""Which weights a request's `model` names, for the calling tenant.

A base model's name runs the base alone. A fine-tuned model id runs its
artifact on the base it was trained on; it is looked up with the caller's
tenant id, so another tenant's model is not found, exactly like one that does
not exist (and so is a deleted one). A checkpoint's name (`{model}:ckpt-step-N`,
registry/parents.py) runs that checkpoint's adapter while the checkpoint is kept.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from tuneforge.db.repos import base_models as base_model_repo
from tuneforge.db.repos import models as model_repo
from tuneforge.domain.errors import not_found
from tuneforge.domain.spec import BaseModelRef
from tuneforge.registry import parents
from tuneforge.serve.params import ADAPTER, FULL_MODEL, ModelTarget
from tuneforge.storage import layout


def resolve_target(session: Session, tenant_id: str, model: str, tenant_name: str = "") -> ModelTarget:
    base = base_model_repo.by_name(session, model)
    if base is not None:
        return ModelTarget(model, BaseModelRef(base.name, base.sha256, base.prefix))
    row = model_repo.get(session, tenant_id, model)
    if row is None and tenant_name:  # a checkpoint, `…:ckpt-step-N`: its adapter on the job's base
        checkpoint = parents.find(session, tenant_id, tenant_name, model)
        if checkpoint is not None and checkpoint.checkpoint is not None and checkpoint.kind == ADAPTER:
            job = checkpoint.job
            assert job is not None  # a job's checkpoint
            base_ref = BaseModelRef(job.model, job.base_model_sha256,
                                    layout.base_model_prefix(job.model, job.base_model_sha256))
            return ModelTarget(model, base_ref, artifact_prefix=checkpoint.checkpoint.prefix, artifact_kind=ADAPTER)
    if row is None or row.deprecated_at is not None or row.artifacts_deleted_at is not None:
        raise not_found(f"The model '{model}' does not exist", param="model", code="model_not_found")
    # The adapter fits the exact base weights it was trained on, kept under their SHA.
    base_ref = BaseModelRef(row.base_model, row.base_model_sha256,
                            layout.base_model_prefix(row.base_model, row.base_model_sha256))
    kind = FULL_MODEL if row.artifact_kind == FULL_MODEL else ADAPTER
    return ModelTarget(model, base_ref, artifact_prefix=row.artifact_prefix, artifact_kind=kind)
