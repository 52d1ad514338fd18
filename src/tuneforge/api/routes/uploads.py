"""/v1/uploads — OpenAI's Uploads API: a file of up to 8 GiB sent in parts of up to 64 MiB.

Extensions: `GET /v1/uploads/{id}` and `GET /v1/uploads/{id}/parts`, so that a
client that lost its place knows which parts arrived and sends the rest.
"""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Depends, UploadFile
from pydantic import BaseModel, ConfigDict, Field, StrictInt

from tuneforge.api import deps
from tuneforge.api.limits import MAX_ID_CHARS
from tuneforge.api.objects import list_object, upload_object, upload_part_object
from tuneforge.api.openapi import error_responses
from tuneforge.api.schemas.base import ObjectRoute
from tuneforge.api.schemas.uploads import Upload, UploadPart, UploadPartList
from tuneforge.db import Session
from tuneforge.db.tables import Tenant
from tuneforge.domain.errors import invalid
from tuneforge.services.context import Platform
from tuneforge.services.datasets import files as file_service
from tuneforge.services.datasets import processing
from tuneforge.services.datasets import uploads as upload_service

router = APIRouter(prefix="/v1/uploads", tags=["uploads"], route_class=ObjectRoute)


class _ExpiresAfter(BaseModel):
    model_config = ConfigDict(extra="forbid")
    anchor: Literal["created_at"]
    seconds: StrictInt


class CreateUpload(BaseModel):
    model_config = ConfigDict(extra="forbid")
    bytes: StrictInt
    filename: str = Field(max_length=512)
    mime_type: str = Field(max_length=255)
    purpose: str = Field(max_length=MAX_ID_CHARS)
    expires_after: _ExpiresAfter | None = Field(
        default=None, description="The expiry of the File the upload becomes (1 hour to 30 days after it is made).")


class CompleteUpload(BaseModel):
    model_config = ConfigDict(extra="forbid")
    part_ids: list[str] = Field(max_length=upload_service.MAX_PARTS)
    md5: str | None = Field(default=None, max_length=64)


def _present(session: Session, row) -> dict:  # noqa: ANN001 - an UploadRow
    return upload_object(row, upload_service.file_of(session, row))


@router.post("", response_model=Upload, responses=error_responses(429))
def create_upload(body: CreateUpload, tenant: Tenant = Depends(deps.tenant), session: Session = deps.SESSION,
                  platform: Platform = Depends(deps.platform)) -> dict:
    expires_after_s = None
    if body.expires_after is not None:
        expires_after_s = file_service.check_expires_after(body.expires_after.anchor, body.expires_after.seconds)
    row = upload_service.create(
        session, tenant.tenant_id, filename=body.filename, purpose=body.purpose, size_bytes=body.bytes,
        mime_type=body.mime_type, max_bytes=platform.settings.max_upload_bytes_by_tier(tenant.tier),
        expires_after_s=expires_after_s, settings=platform.settings)
    return _present(session, row)


@router.get("/{upload_id}", response_model=Upload)
def retrieve_upload(upload_id: str, tenant: Tenant = Depends(deps.tenant), session: Session = deps.SESSION,
                    platform: Platform = Depends(deps.platform)) -> dict:
    """Extension: the upload as it stands (OpenAI has no retrieve call)."""
    return _present(session, upload_service.get(session, platform.store, tenant.tenant_id, upload_id))


@router.post("/{upload_id}/parts", response_model=UploadPart, responses=error_responses(413))
def add_part(upload_id: str, data: UploadFile | None = None, tenant: Tenant = Depends(deps.tenant),
             session: Session = deps.SESSION, platform: Platform = Depends(deps.platform)) -> dict:
    if data is None:
        raise invalid("Missing required parameter: 'data'", param="data", code="missing_required_parameter")
    part = upload_service.add_part(session, platform.store, tenant.tenant_id, upload_id, data.file)
    return upload_part_object(part)


@router.get("/{upload_id}/parts", response_model=UploadPartList)
def list_parts(upload_id: str, tenant: Tenant = Depends(deps.tenant), session: Session = deps.SESSION,
               platform: Platform = Depends(deps.platform)) -> dict:
    """Extension: the parts received so far, oldest first, with their sizes."""
    parts = upload_service.parts_of(session, platform.store, tenant.tenant_id, upload_id)
    return list_object(parts, upload_part_object, False)


@router.post("/{upload_id}/complete", response_model=Upload)
def complete_upload(upload_id: str, body: CompleteUpload, tenant: Tenant = Depends(deps.tenant),
                    session: Session = deps.SESSION, platform: Platform = Depends(deps.platform)) -> dict:
    row = upload_service.complete(
        session, platform.store, tenant.tenant_id, upload_id, part_ids=body.part_ids, md5=body.md5,
        tier=tenant.tier, settings=platform.settings)
    processing.settle(session, platform, tenant.tenant_id, row.file_id)  # validated, or still processing
    return _present(session, row)


@router.post("/{upload_id}/cancel", response_model=Upload)
def cancel_upload(upload_id: str, tenant: Tenant = Depends(deps.tenant), session: Session = deps.SESSION,
                  platform: Platform = Depends(deps.platform)) -> dict:
    return _present(session, upload_service.cancel(session, platform.store, tenant.tenant_id, upload_id))
