"""Uploads (/v1/uploads): OpenAI's upload and upload part; extensions `mime_type` and
`received_bytes` (what arrived so far) on an upload, `bytes` on a part."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tuneforge.api.schemas.base import ApiObject, Page
from tuneforge.api.schemas.files import FileObject


class Upload(ApiObject):
    id: str
    object: Literal["upload"]
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: str = Field(description="pending, completed, cancelled or expired.")
    expires_at: int
    file: FileObject | None = Field(description="The file the upload became, once completed.")


class UploadPart(ApiObject):
    id: str
    object: Literal["upload.part"]
    created_at: int
    upload_id: str


class UploadPartList(Page):
    """Extension: the parts received so far, oldest first."""

    data: list[UploadPart]
