"""/v1/files — OpenAI's Files API."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Form, Query, UploadFile
from fastapi.responses import StreamingResponse

from tuneforge.api import deps
from tuneforge.api.headers import attachment
from tuneforge.api.limits import MAX_ID_CHARS
from tuneforge.api.objects import file_object, list_object
from tuneforge.api.openapi import binary_body, error_responses
from tuneforge.api.schemas.base import ObjectRoute
from tuneforge.api.schemas.files import FileDeleted, FileList, FileObject, FilePreview, FileValidation
from tuneforge.db import Session
from tuneforge.db.tables import Tenant
from tuneforge.domain.errors import invalid
from tuneforge.services.context import Platform
from tuneforge.services.datasets import checks as datasets
from tuneforge.services.datasets import files as file_service
from tuneforge.services.datasets import previews, processing

router = APIRouter(prefix="/v1/files", tags=["files"], route_class=ObjectRoute)


@router.post("", response_model=FileObject, responses=error_responses(413))
def create_file(
    file: UploadFile | None = None,
    purpose: str | None = Form(default=None, max_length=MAX_ID_CHARS),
    expires_anchor: str | None = Form(default=None, alias="expires_after[anchor]", max_length=MAX_ID_CHARS),
    expires_seconds: str | None = Form(default=None, alias="expires_after[seconds]", max_length=MAX_ID_CHARS),
    tenant: Tenant = Depends(deps.tenant),
    session: Session = deps.SESSION,
    platform: Platform = Depends(deps.platform),
) -> dict:
    if file is None:
        raise invalid("Missing required parameter: 'file'", param="file", code="missing_required_parameter")
    if not purpose:
        raise invalid("Missing required parameter: 'purpose'", param="purpose", code="missing_required_parameter")
    expires_after_s = None
    if expires_anchor is not None or expires_seconds is not None:
        expires_after_s = file_service.check_expires_after(expires_anchor, expires_seconds)
    row = file_service.upload(
        session, platform.store, tenant.tenant_id, filename=file.filename or "", purpose=purpose,
        stream=file.file, max_bytes=platform.settings.max_upload_bytes_by_tier(tenant.tier),
        tier=tenant.tier, expires_after_s=expires_after_s, settings=platform.settings,
    )
    processing.settle(session, platform, tenant.tenant_id, row.file_id)  # validated, or still processing
    return file_object(row)


@router.get("", response_model=FileList)
def list_files(
    purpose: str | None = Query(default=None, max_length=MAX_ID_CHARS),
    after: str | None = Query(default=None, max_length=MAX_ID_CHARS),
    limit: int = Query(default=100, ge=1, le=10000),
    order: str = Query(default="desc", max_length=MAX_ID_CHARS),
    tenant: Tenant = Depends(deps.tenant),
    session: Session = deps.SESSION,
) -> dict:
    page = file_service.list_files(session, tenant.tenant_id, purpose=purpose, after=after, limit=limit, order=order)
    return list_object(page.rows, file_object, page.has_more)


@router.get("/{file_id}", response_model=FileObject)
def retrieve_file(file_id: str, tenant: Tenant = Depends(deps.tenant), session: Session = deps.SESSION) -> dict:
    return file_object(file_service.get(session, tenant.tenant_id, file_id))


@router.get("/{file_id}/validation", response_model=FileValidation)
def file_validation(
    file_id: str,
    tenant: Tenant = Depends(deps.tenant),
    session: Session = deps.SESSION,
    platform: Platform = Depends(deps.platform),
) -> dict:
    """Extension: the full validation report of a fine-tune file."""
    row = file_service.get(session, tenant.tenant_id, file_id)
    report = datasets.file_report(platform.store, tenant.tenant_id, row.file_id, row.purpose, row.status)
    return {"object": "file.validation", "file_id": row.file_id, "status": row.status, **report}


@router.get("/{file_id}/preview", response_model=FilePreview)
def file_preview(
    file_id: str,
    model: str = Query(max_length=MAX_ID_CHARS, description="The base model whose chat template and tokenizer render "
                                                            "the examples."),
    limit: int = Query(default=3, ge=1, le=previews.MAX_EXAMPLES),
    max_seq_length: int = Query(default=2048, ge=16, le=131072),
    train_on_inputs: bool = Query(default=False),
    tenant: Tenant = Depends(deps.tenant),
    session: Session = deps.SESSION,
    platform: Platform = Depends(deps.platform),
) -> dict:
    """Extension: the first examples rendered through the base model's chat template, each token
    marked with whether training puts loss on it (the loss mask)."""
    return previews.preview(session, platform, tenant.tenant_id, file_id, model, limit, max_seq_length,
                            train_on_inputs)


@router.delete("/{file_id}", response_model=FileDeleted)
def delete_file(
    file_id: str,
    tenant: Tenant = Depends(deps.tenant),
    session: Session = deps.SESSION,
    platform: Platform = Depends(deps.platform),
) -> dict:
    row, derived = file_service.delete(session, platform.store, tenant.tenant_id, file_id)
    return {"id": row.file_id, "object": "file", "deleted": True, "derived_deleted": derived.removed,
            "derived_kept": derived.kept}


@router.get("/{file_id}/content", response_class=StreamingResponse,
            responses=binary_body("application/octet-stream", "The file's bytes as uploaded."))
def file_content(
    file_id: str,
    tenant: Tenant = Depends(deps.tenant),
    session: Session = deps.SESSION,
    platform: Platform = Depends(deps.platform),
) -> StreamingResponse:
    row = file_service.get(session, tenant.tenant_id, file_id)
    handle = platform.store.open_read(row.key)

    def chunks():
        with handle:
            while chunk := handle.read(1 << 20):
                yield chunk

    return StreamingResponse(
        chunks(), media_type="application/octet-stream",
        headers={"Content-Disposition": attachment(row.filename), "Content-Length": str(row.size_bytes)},
    )
