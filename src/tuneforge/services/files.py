"""Files: upload (streamed to the object store, validated), list, delete, content."""

from __future__ import annotations

import hashlib
import time
from typing import IO

from sqlalchemy.orm import Session

from tuneforge.services import datasets
from tuneforge.db.pagination import Page
from tuneforge.db.repos import files as file_repo
from tuneforge.db.tables import FileRow
from tuneforge.domain.errors import ApiError, invalid, not_found
from tuneforge.domain.ids import new_id
from tuneforge.storage import layout
from tuneforge.storage.store import ObjectStore

PURPOSES = ("fine-tune", "fine-tune-results", "batch", "assistants", "user_data", "evals")
UPLOADABLE = ("fine-tune", "batch", "assistants", "user_data", "evals")
MAX_FILENAME_CHARS = 256  # the column holds 512; a name is shown back in listings and headers


class _HashingReader:
    """Wraps an upload stream: counts bytes, hashes them, enforces a size cap."""

    def __init__(self, stream: IO[bytes], max_bytes: int) -> None:
        self._stream = stream
        self._max_bytes = max_bytes
        self.size_bytes = 0
        self.digest = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        chunk = self._stream.read(size)
        self.size_bytes += len(chunk)
        if self.size_bytes > self._max_bytes:
            raise ApiError(413, f"file is larger than {self._max_bytes} bytes", param="file", code="file_too_large")
        self.digest.update(chunk)
        return chunk


def upload(
    session: Session,
    store: ObjectStore,
    tenant_id: str,
    *,
    filename: str,
    purpose: str,
    stream: IO[bytes],
    max_bytes: int,
    tier: str = "standard",
    contamination=None,  # noqa: ANN001 - a ContaminationIndex of the eval sets
) -> FileRow:
    if purpose not in UPLOADABLE:
        raise invalid(f"purpose must be one of {', '.join(UPLOADABLE)}; got {purpose!r}", param="purpose")
    if not filename:
        raise invalid("the upload has no filename", param="file")
    _check_filename(filename)
    file_id = new_id("file")
    try:
        key = layout.file_key(tenant_id, file_id, filename)
    except ValueError:  # ".", "..": names that are no file's
        raise invalid(f"{filename!r} cannot be a file's name", param="file", code="invalid_filename") from None
    reader = _HashingReader(stream, max_bytes)
    try:
        store.put_stream(key, reader)
    except ApiError:
        store.delete_prefix(layout.file_prefix(tenant_id, file_id))
        raise
    row = FileRow(
        file_id=file_id,
        tenant_id=tenant_id,
        filename=filename,
        purpose=purpose,
        size_bytes=reader.size_bytes,
        key=key,
        sha256=reader.digest.hexdigest(),
        status="uploaded",
        created_at=int(time.time()),
    )
    if purpose == "fine-tune":
        _validate(store, row, tier, contamination)
    else:
        row.status = "processed"
    session.add(row)
    session.flush()
    return row


def _check_filename(filename: str) -> None:
    if len(filename) > MAX_FILENAME_CHARS:
        raise invalid(f"the filename is longer than {MAX_FILENAME_CHARS} characters", param="file")
    if any(ord(ch) < 0x20 or 0xD800 <= ord(ch) <= 0xDFFF for ch in filename):
        raise invalid("the filename must not hold control characters or lone surrogates", param="file",
                      code="invalid_filename")


def _validate(store: ObjectStore, row: FileRow, tier: str, contamination) -> None:  # noqa: ANN001
    report = datasets.check_upload(store, row.key, row.filename, row.tenant_id, row.file_id, tier, contamination)
    row.num_examples = report.num_examples
    row.data_format = report.data_format
    row.data_kind = report.kind
    row.status = "processed" if report.ok else "error"
    row.status_details = report.summary() or None


def add_generated(
    session: Session, store: ObjectStore, tenant_id: str, *, filename: str, purpose: str, data: bytes
) -> FileRow:
    """A platform-written file (e.g. training results) owned by the tenant."""
    file_id = new_id("file")
    key = layout.file_key(tenant_id, file_id, filename)
    store.put_bytes(key, data)
    row = FileRow(
        file_id=file_id,
        tenant_id=tenant_id,
        filename=filename,
        purpose=purpose,
        size_bytes=len(data),
        key=key,
        sha256=hashlib.sha256(data).hexdigest(),
        status="processed",
        created_at=int(time.time()),
    )
    session.add(row)
    session.flush()
    return row


def get(session: Session, tenant_id: str, file_id: str) -> FileRow:
    row = file_repo.get(session, tenant_id, file_id)
    if row is None:
        raise not_found(f"No such File object: {file_id}", param="file_id")
    return row


def list_files(
    session: Session, tenant_id: str, *, purpose: str | None, after: str | None, limit: int, order: str
) -> Page:
    if order not in ("asc", "desc"):
        raise invalid("order must be 'asc' or 'desc'", param="order")
    return file_repo.page(
        session, tenant_id, purpose=purpose, after=after, limit=limit, ascending=order == "asc"
    )


def delete(session: Session, store: ObjectStore, tenant_id: str, file_id: str) -> FileRow:
    row = get(session, tenant_id, file_id)
    session.delete(row)
    session.flush()
    store.delete_prefix(layout.file_prefix(tenant_id, file_id))
    store.delete(layout.file_report_key(tenant_id, file_id))
    return row
