"""/v1/models — base models and the calling tenant's fine-tuned models."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from sqlalchemy.orm import Session

from tuneforge.api import deps
from tuneforge.api.objects import base_model_object, fine_tuned_model_object
from tuneforge.db.repos import base_models as base_model_repo
from tuneforge.db.repos import models as model_repo
from tuneforge.db.tables import Tenant
from tuneforge.domain.errors import not_found

router = APIRouter(prefix="/v1/models", tags=["models"])


@router.get("")
def list_models(tenant: Tenant = Depends(deps.tenant), session: Session = deps.SESSION) -> dict:
    data = [base_model_object(row) for row in base_model_repo.list_all(session)]
    data += [fine_tuned_model_object(row) for row in model_repo.list_for_tenant(session, tenant.tenant_id)]
    return {"object": "list", "data": data}


@router.get("/{model_id:path}")
def retrieve_model(model_id: str, tenant: Tenant = Depends(deps.tenant),
                   session: Session = deps.SESSION) -> dict:
    base = base_model_repo.by_name(session, model_id)
    if base is not None:
        return base_model_object(base)
    row = model_repo.get(session, tenant.tenant_id, model_id)
    if row is None:
        raise not_found(f"The model '{model_id}' does not exist", param="model", code="model_not_found")
    return fine_tuned_model_object(row)
