"""The rules a job's training and validation files must meet, in one place: at create (400
naming the field) and, for a file that was still processing then, when the scheduler validates
the job once the file's own validation has ended."""

from __future__ import annotations

from sqlalchemy.orm import Session

from tuneforge import methods
from tuneforge.db.repos import files as file_repo
from tuneforge.db.tables import FileRow
from tuneforge.domain.errors import ApiError, invalid


def check_file(session: Session, tenant_id: str, file_id: str, param: str, min_examples: int,
               method: str = "supervised", *, allow_processing: bool = False) -> FileRow:
    """The tenant's fine-tune file `file_id`, fit for `method`; 400 naming `param` otherwise. A
    file still processing is accepted with `allow_processing` (its contents are checked later by
    `check_contents`), and answers `file_not_ready` without."""
    row = file_repo.get(session, tenant_id, file_id)
    if row is None:
        raise invalid(f"invalid {param}: no such file {file_id}", param=param, code="file_not_found")
    if row.purpose != "fine-tune":
        raise invalid(
            f"invalid {param}: file {file_id} has purpose {row.purpose!r}, expected 'fine-tune'",
            param=param, code="invalid_file_purpose",
        )
    if row.status == "error":
        raise invalid(f"invalid {param} {file_id}: {row.status_details}", param=param, code="invalid_file")
    if row.status == "processing" and allow_processing:
        return row
    if row.status != "processed":
        raise invalid(f"{param} {file_id} is still being processed; wait until its status is processed "
                      f"(GET /v1/files/{file_id})", param=param, code="file_not_ready")
    check_contents(row, param, min_examples, method)
    return row


def check_contents(row: FileRow, param: str, min_examples: int, method: str) -> None:
    """What the file's upload validation found, against what the job needs (400 naming `param`)."""
    kinds = methods.get(method).data_kinds
    if row.data_kind and row.data_kind not in kinds:
        raise invalid(
            f"{param} {row.file_id} holds {row.data_kind} examples; method {method!r} needs "
            f"{' or '.join(kinds)} data", param=param, code="shape_mismatch",
        )
    if (row.num_examples or 0) < min_examples:
        raise invalid(
            f"{param} {row.file_id} has {row.num_examples} example(s); at least {min_examples} are required",
            param=param, code="too_few_examples",
        )


def failed_file_error(row: FileRow, param: str) -> ApiError:
    """The error a job gets when a file it waited for ended its validation in error."""
    return invalid(f"{param} {row.file_id} failed validation: {row.status_details or 'see its report'} (the "
                   f"whole report: GET /v1/files/{row.file_id}/validation)", param=param,
                   code="invalid_training_file")
