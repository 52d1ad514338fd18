"""Files (/v1/files): OpenAI's file object, list and delete, and the validation and preview
extensions."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from tuneforge.api.schemas.base import ApiObject, Deleted, Page


class FileObject(ApiObject):
    id: str
    object: Literal["file"]
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: str = Field(description="uploaded, processed or error (the validation of a fine-tune file).")
    status_details: str | None = None
    expires_at: int | None = None
    sha256: str = Field(description="Extension: the SHA-256 of the file's bytes (hex), to find a file already "
                                    "uploaded with the same content.")


class FileList(Page):
    data: list[FileObject]


class DerivedKept(ApiObject):
    dataset_id: str
    job_id: str = Field(description="An unfinished job that still trains on the dataset.")


class FileDeleted(Deleted):
    object: Literal["file"]
    derived_deleted: list[str] = Field(default_factory=list, description=(
        "Extension: prepared datasets made from the file that were deleted with it (with their tokenized "
        "caches and reference log-probabilities)."))
    derived_kept: list[DerivedKept] = Field(default_factory=list, description=(
        "Extension: prepared datasets kept because an unfinished job still trains on them."))


class FileValidation(ApiObject):
    """Extension: the full validation report of a fine-tune file."""

    object: Literal["file.validation"]
    file_id: str
    status: str


class FilePreview(ApiObject):
    """Extension: the first examples rendered through a base model's chat template, each token
    marked with whether training puts loss on it."""

    object: Literal["file.preview"]
    file_id: str
    model: str
    max_seq_length: int
    train_on_inputs: bool
    examples: list[Any]
