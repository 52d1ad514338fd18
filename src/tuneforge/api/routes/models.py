"""/v1/models — base models and the calling tenant's fine-tuned models (the registry).

OpenAI's list, retrieve and delete, plus the registry's extensions: filters
(`type`, `base_model`, `stage`), `POST /v1/models/{model}/promote`, restore of
a deleted (deprecated) model during its grace period, the stage history,
`POST /v1/models` (a training-API checkpoint registered as a model) and
`GET /v1/models/{model}/download` (its weights: an adapter in PEFT's format).
Deleting deprecates: the model disappears from listings at once and its
artifacts are removed once `TUNEFORGE_MODEL_DELETE_GRACE_S` has passed.
"""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Depends, Query
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from tuneforge.api import deps
from tuneforge.api.headers import attachment
from tuneforge.api.limits import MAX_ID_CHARS, MAX_NAME_CHARS
from tuneforge.api.objects import base_model_object, fine_tuned_model_object
from tuneforge.api.openapi import binary_body, error_responses
from tuneforge.api.schemas.base import ObjectRoute
from tuneforge.api.schemas.models import Model, ModelDeleted, ModelList, StageHistory
from tuneforge.db import Session
from tuneforge.db.tables import Tenant
from tuneforge.domain.errors import ApiError
from tuneforge.registry import models as registry
from tuneforge.registry import parents
from tuneforge.serve.vllm import serving_changed
from tuneforge.services.context import Platform
from tuneforge.services.serving import base_models as base_model_service
from tuneforge.services.training import artifacts
from tuneforge.services.training_api import register

router = APIRouter(prefix="/v1/models", tags=["models"], route_class=ObjectRoute)


class PromoteBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    stage: Literal["dev", "staging", "production", "archived"] = Field(description="The stage to move to.")


class RegisterBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    source: str = Field(max_length=1024, description="A training-API checkpoint of the caller's: "
                        "tinker://<model id>/weights/<name> (save_state) or .../sampler_weights/<name> "
                        "(save_weights_for_sampler).")
    suffix: str | None = Field(None, max_length=64, description="Put in the model's name, as a job's suffix.")


def _actor(tenant: Tenant) -> str:
    return f"tenant:{tenant.tenant_id}"


@router.get("", response_model=ModelList)
def list_models(
    type: Literal["base", "fine-tuned"] | None = Query(None, description="Only base or only fine-tuned models."),
    base_model: str | None = Query(None, max_length=MAX_ID_CHARS, description="Fine-tuned models of this base model."),
    stage: str | None = Query(None, max_length=MAX_NAME_CHARS, description="Fine-tuned models in this stage."),
    include_deprecated: bool = Query(False, description="Also deleted models still in their grace period."),
    tenant: Tenant = Depends(deps.tenant), session: Session = deps.SESSION,
) -> dict:
    data = []
    if type in (None, "base") and base_model is None and stage is None:
        data += [base_model_object(row) for row in base_model_service.list_base_models(session)]
    if type in (None, "fine-tuned"):
        rows = registry.listing(session, tenant.tenant_id, base_model=base_model, stage=stage,
                                include_deprecated=include_deprecated)
        data += [fine_tuned_model_object(row) for row in rows]
    return {"object": "list", "data": data}


@router.post("", response_model=Model, responses=error_responses(404, 409))
def register_model(body: RegisterBody, tenant: Tenant = Depends(deps.tenant), session: Session = deps.SESSION,
                   platform: Platform = Depends(deps.platform)) -> dict:
    """Extension: a training-API checkpoint registered as a fine-tuned model, to chat with, continue
    by a job, download and promote like any other (`services/training_api/register.py`)."""
    row = register.register(session, platform, tenant, body.source, body.suffix)
    session.commit()
    return fine_tuned_model_object(row)


@router.get("/{model_id:path}/download", response_class=StreamingResponse,
            responses={**binary_body("application/gzip", "The model's weights as a .tar.gz archive."),
                       **error_responses(409)})
def download_model(model_id: str, tenant: Tenant = Depends(deps.tenant), session: Session = deps.SESSION,
                   platform: Platform = Depends(deps.platform)) -> Response:
    """Extension: a fine-tuned model's weights, whichever made it: an adapter in PEFT's format
    (`PeftModel.from_pretrained(base, folder)`), or a full fine-tune's model folder."""
    row = registry.get(session, tenant.tenant_id, model_id)
    if row.deprecated_at is not None:
        raise registry.model_not_found(model_id)
    name, archive = artifacts.model_archive(platform.store, row)
    return StreamingResponse(artifacts.iter_file(archive), media_type="application/gzip",
                             headers={"Content-Disposition": attachment(name)})


@router.post("/{model_id:path}/promote", response_model=Model, responses=error_responses(409))
def promote_model(model_id: str, body: PromoteBody, tenant: Tenant = Depends(deps.tenant),
                  session: Session = deps.SESSION, platform: Platform = Depends(deps.platform)) -> dict:
    """A checkpoint's name (`…:ckpt-step-N`) registers the checkpoint as a model first."""
    try:
        row = registry.get(session, tenant.tenant_id, model_id)
    except ApiError:
        checkpoint = parents.find(session, tenant.tenant_id, tenant.name, model_id)
        if checkpoint is None or checkpoint.checkpoint is None or checkpoint.job is None \
                or checkpoint.kind != "adapter":
            raise
        row = registry.register_checkpoint(session, platform.store, checkpoint.job, model_id=model_id,
                                           step=checkpoint.step, source_prefix=checkpoint.checkpoint.prefix)
    registry.promote(session, row, body.stage, actor=_actor(tenant))
    session.commit()  # stored before the vLLM servers are brought in line
    serving_changed(platform, session)
    return fine_tuned_model_object(row)


@router.post("/{model_id:path}/restore", response_model=Model, responses=error_responses(409))
def restore_model(model_id: str, tenant: Tenant = Depends(deps.tenant), session: Session = deps.SESSION,
                  platform: Platform = Depends(deps.platform)) -> dict:
    row = registry.get(session, tenant.tenant_id, model_id)
    registry.restore(session, row, actor=_actor(tenant))
    session.commit()  # stored before the vLLM servers are brought in line
    serving_changed(platform, session)
    return fine_tuned_model_object(row)


@router.get("/{model_id:path}/stages", response_model=StageHistory)
def stage_history(model_id: str, tenant: Tenant = Depends(deps.tenant), session: Session = deps.SESSION) -> dict:
    row = registry.get(session, tenant.tenant_id, model_id)
    return {"object": "list", "data": [stage_change_object(c) for c in registry.history(session, row)]}


def stage_change_object(change) -> dict:  # noqa: ANN001 - a ModelStageChange row
    return {"object": "model.stage_change", "model": change.model_id, "from_stage": change.from_stage,
            "to_stage": change.to_stage, "actor": change.actor, "override": change.override,
            "reason": change.reason, "created_at": change.created_at}


@router.get("/{model_id:path}", response_model=Model)
def retrieve_model(model_id: str, include_deprecated: bool = Query(
                       False, description="Extension: a deleted model still in its grace period answers too."),
                   tenant: Tenant = Depends(deps.tenant), session: Session = deps.SESSION) -> dict:
    base = base_model_service.find(session, model_id)
    if base is not None:
        return base_model_object(base)
    row = registry.get(session, tenant.tenant_id, model_id)
    if row.deprecated_at is not None and not include_deprecated:  # deleted, as OpenAI has it: 404
        raise registry.model_not_found(model_id)
    return fine_tuned_model_object(row)


@router.delete("/{model_id:path}", response_model=ModelDeleted, responses=error_responses(409))
def delete_model(model_id: str, tenant: Tenant = Depends(deps.tenant), session: Session = deps.SESSION,
                 platform: Platform = Depends(deps.platform)) -> dict:
    base_model_service.refuse_deleting(session, model_id)
    row = registry.get(session, tenant.tenant_id, model_id)
    if row.deprecated_at is not None:  # deleted already: gone, as OpenAI answers a second delete
        raise registry.model_not_found(model_id)
    registry.deprecate(session, row, grace_s=platform.settings.model_delete_grace_s, actor=_actor(tenant))
    session.commit()  # stored before the vLLM servers are brought in line
    serving_changed(platform, session)
    return {"id": row.model_id, "object": "model", "deleted": True, "delete_after": row.delete_after}
