"""Files (/v1/files): OpenAI's file object, list and delete, and the validation and preview
extensions."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from tuneforge.api.schemas.base import ApiObject, Deleted, Page


class FileValidationProgress(ApiObject):
    rows_checked: int = Field(description="Rows read so far (all of them once the check has ended).")
    bytes_checked: int = Field(description="Bytes of the file read so far.")
    bytes_total: int = Field(description="The file's size in bytes.")
    percent: float = Field(description="bytes_checked as a share of bytes_total: at most 99.9 while the check "
                                       "runs (the reader is ahead of the checks), 100 once it has ended.")


class FileObject(ApiObject):
    id: str
    object: Literal["file"]
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: str = Field(description="processed, error, or processing while a fine-tune file is validated in the "
                                    "background (OpenAI's uploaded: not processed yet).")
    status_details: str | None = None
    expires_at: int | None = None
    sha256: str = Field(description="Extension: the SHA-256 of the file's bytes (hex), to find a file already "
                                    "uploaded with the same content.")
    validation: FileValidationProgress | None = Field(
        default=None, description="Extension: how far the validation of a fine-tune file has got (its final "
                                  "figures once it has ended); null for other purposes.")


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
