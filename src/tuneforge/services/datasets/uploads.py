"""Uploads: one file sent in parts (OpenAI's Uploads API).

`create` declares the file (name, purpose, size, MIME type); each `add_part`
streams up to 64 MiB to the object store as an object of its own; `complete`
puts the parts together in the order the client names, checks the size (and
the md5 when given), and makes the File, validated like any upload. On S3 the
parts are put together inside the store (a multipart upload of server-side
copies), elsewhere streamed through a chunk at a time: no step holds a part in
memory. An Upload that is neither completed nor cancelled expires an hour after
it was created; its parts are deleted then (`expire`, run by the scheduler's
housekeeping, and on any later request for it).

Limits, checked under the tenant's lock so that parallel parts cannot race
past them: the declared size is at most the tenant tier's file limit (8 GiB at
most; an evals file at most `eval_sets.MAX_EVALS_FILE_BYTES`); the parts never
add up to more than it; at most `MAX_PARTS` parts; with `settings`, the tier's
storage quota (`quotas.check_pending_upload`: pending uploads and the bytes they
declare, 429 with Retry-After; the files' bytes at create and again at complete,
403), else at most `MAX_PENDING_UPLOADS` pending uploads per tenant.
"""

from __future__ import annotations

import hashlib
import re
import time
from typing import IO

from sqlalchemy.orm import Session

from tuneforge.db.repos import tenants as tenant_repo
from tuneforge.db.repos import uploads as upload_repo
from tuneforge.db.tables import FileRow, UploadPartRow, UploadRow
from tuneforge.domain.errors import ApiError, invalid, not_found, rate_limited
from tuneforge.domain.ids import new_id
from tuneforge.services.datasets import files as file_service
from tuneforge.services.tenancy import quotas
from tuneforge.services.training import eval_sets
from tuneforge.settings import Settings
from tuneforge.storage import layout
from tuneforge.storage.store import ObjectStore

MAX_PART_BYTES = 64 * 1024 * 1024
MAX_UPLOAD_BYTES = 8 * 1024 * 1024 * 1024
MAX_PARTS = 10_000
MAX_PENDING_UPLOADS = 100
UPLOAD_TTL_S = 3600
_READ_CHUNK_BYTES = 4 * 1024 * 1024
_MIME_TYPE = re.compile(r"^[a-z0-9][a-z0-9!#$&^_.+-]{0,126}/[a-z0-9][a-z0-9!#$&^_.+-]{0,126}$")
_MD5 = re.compile(r"^[0-9a-fA-F]{32}$")
# What a fine-tune file may be sent as: JSONL (under its several names), CSV, Parquet, gzip of
# those, or an archive of a saved Hugging Face dataset; the bytes decide the format, not this.
FINE_TUNE_MIME_TYPES = frozenset({
    "application/jsonl", "text/jsonl", "application/x-jsonl", "application/jsonlines", "application/x-ndjson",
    "application/json", "text/plain", "text/csv", "application/csv", "application/vnd.apache.parquet",
    "application/x-parquet", "application/gzip", "application/x-gzip", "application/x-tar", "application/zip",
    "application/octet-stream",
})


def create(session: Session, tenant_id: str, *, filename: str, purpose: str, size_bytes: object, mime_type: str,
           max_bytes: int, expires_after_s: int | None = None, settings: Settings | None = None) -> UploadRow:
    file_service.check_purpose(purpose)
    file_service.new_file_key(tenant_id, filename, param="filename")  # the name must make a file
    if purpose == "evals":
        max_bytes = min(max_bytes, eval_sets.MAX_EVALS_FILE_BYTES)
    _check_size(size_bytes, min(max_bytes, MAX_UPLOAD_BYTES))
    mime = _check_mime_type(mime_type, purpose)
    tenant = tenant_repo.lock(session, tenant_id)
    if settings is not None and tenant is not None:
        quotas.check_pending_upload(session, settings, tenant, int(size_bytes), time.time())  # type: ignore[arg-type]
    pending = upload_repo.count_pending(session, tenant_id, int(time.time()))
    if pending >= MAX_PENDING_UPLOADS:
        raise rate_limited(f"You have {pending} pending uploads, the most allowed; complete or cancel one first.",
                           code="too_many_pending_uploads", retry_after=60)
    now = int(time.time())
    row = UploadRow(
        upload_id=new_id("upload", sep="_"), tenant_id=tenant_id, filename=filename, purpose=purpose,
        mime_type=mime, size_bytes=int(size_bytes), received_bytes=0, status="pending",  # type: ignore[arg-type]
        file_expires_after_s=expires_after_s, created_at=now, expires_at=now + UPLOAD_TTL_S,
    )
    session.add(row)
    session.flush()
    return row


def _check_size(size_bytes: object, limit: int) -> None:
    if isinstance(size_bytes, bool) or not isinstance(size_bytes, int) or size_bytes < 1:
        raise invalid("bytes must be a positive integer: the size of the file in bytes", param="bytes")
    if size_bytes > limit:
        raise invalid(f"bytes is {size_bytes}; an upload may be at most {limit} bytes", param="bytes",
                      code="file_too_large")


def _check_mime_type(mime_type: str, purpose: str) -> str:
    mime = (mime_type or "").strip().lower()
    if not _MIME_TYPE.match(mime):
        raise invalid(f"mime_type {mime_type[:80]!r} is not a MIME type (type/subtype)", param="mime_type")
    if purpose == "fine-tune" and mime not in FINE_TUNE_MIME_TYPES:
        raise invalid(f"mime_type {mime!r} is not supported for purpose 'fine-tune'; use one of "
                      f"{', '.join(sorted(FINE_TUNE_MIME_TYPES))}", param="mime_type",
                      code="unsupported_mime_type")
    return mime


def get(session: Session, store: ObjectStore, tenant_id: str, upload_id: str) -> UploadRow:
    row = upload_repo.get(session, tenant_id, upload_id)
    if row is None:
        raise not_found(f"No such Upload object: {upload_id}", param="upload_id")
    if row.status == "pending" and row.expires_at <= time.time():
        _end(store, row, "expired")
    return row


def _locked(session: Session, store: ObjectStore, tenant_id: str, upload_id: str) -> UploadRow:
    """The upload read afresh under the tenant's lock: what follows cannot race another request."""
    tenant_repo.lock(session, tenant_id)
    row = upload_repo.get(session, tenant_id, upload_id, fresh=True)
    if row is None:
        raise not_found(f"No such Upload object: {upload_id}", param="upload_id")
    if row.status == "pending" and row.expires_at <= time.time():
        _end(store, row, "expired")
    return row


def _require_pending(row: UploadRow, doing: str) -> None:
    if row.status != "pending":
        raise invalid(f"Upload {row.upload_id} is {row.status}; {doing} only to a pending upload",
                      param="upload_id", code="upload_not_pending")


def add_part(session: Session, store: ObjectStore, tenant_id: str, upload_id: str, stream: IO[bytes]) -> UploadPartRow:
    """Stream one part (at most `MAX_PART_BYTES`) to the store, then record it: under the lock the
    upload must still be pending and have room for it, else the part's bytes are deleted again."""
    _require_pending(get(session, store, tenant_id, upload_id), "parts can be added")
    session.commit()  # no transaction stays open while the part streams in
    part_id = new_id("part", sep="_")
    key = layout.upload_part_key(tenant_id, upload_id, part_id)
    try:
        size = store.put_stream(key, _Capped(stream, MAX_PART_BYTES))
        if size == 0:
            raise invalid("the part is empty", param="data", code="empty_part")
        row = _locked(session, store, tenant_id, upload_id)
        _require_pending(row, "parts can be added")
        if upload_repo.count_parts(session, upload_id) >= MAX_PARTS:
            raise invalid(f"an upload has at most {MAX_PARTS} parts", param="data", code="too_many_parts")
        if row.received_bytes + size > row.size_bytes:
            raise invalid(f"this part of {size} bytes would take the upload to {row.received_bytes + size} bytes, "
                          f"past the {row.size_bytes} declared at create", param="data",
                          code="upload_size_exceeded")
        row.received_bytes += size
        part = UploadPartRow(part_id=part_id, upload_id=upload_id, tenant_id=tenant_id, size_bytes=size, key=key,
                             created_at=int(time.time()))
        session.add(part)
        session.flush()
        return part
    except BaseException:
        store.delete(key)
        raise


class _Capped:
    """A request body read through, refused past `limit` bytes (413)."""

    def __init__(self, stream: IO[bytes], limit: int) -> None:
        self._stream = stream
        self._limit = limit
        self.size = 0

    def read(self, size: int = -1) -> bytes:
        chunk = self._stream.read(size)
        self.size += len(chunk)
        if self.size > self._limit:
            raise ApiError(413, f"a part may be at most {self._limit} bytes", param="data", code="part_too_large")
        return chunk


def complete(session: Session, store: ObjectStore, tenant_id: str, upload_id: str, *, part_ids: object,
             md5: object, tier: str, settings: Settings | None = None) -> UploadRow:
    """The parts, in the order of `part_ids`, become a File. The sizes must add up to the declared
    bytes; a wrong md5 leaves the upload pending (another order may be meant), and nothing is lost.
    A fine-tune file comes out `processing`: `processing.settle` starts its validation."""
    if not isinstance(part_ids, list) or not part_ids or not all(isinstance(p, str) for p in part_ids):
        raise invalid("part_ids must be a non-empty list of the upload's part ids", param="part_ids")
    if md5 is not None and (not isinstance(md5, str) or not _MD5.match(md5)):
        raise invalid("md5 must be the file's MD5 digest as 32 hexadecimal characters", param="md5")
    if len(set(part_ids)) != len(part_ids):
        raise invalid("part_ids names a part more than once", param="part_ids", code="duplicate_part")
    row = _locked(session, store, tenant_id, upload_id)
    _require_pending(row, "completion applies")
    parts = {part.part_id: part for part in upload_repo.parts(session, upload_id)}
    for index, part_id in enumerate(part_ids):
        if part_id not in parts:
            raise invalid(f"part_ids[{index}] {part_id[:80]!r} is not a part of upload {upload_id}",
                          param=f"part_ids[{index}]", code="invalid_part")
    ordered = [parts[part_id] for part_id in part_ids]
    total = sum(part.size_bytes for part in ordered)
    if total != row.size_bytes:
        raise invalid(f"the parts named hold {total} bytes; the upload was created with bytes={row.size_bytes}",
                      param="part_ids", code="upload_size_mismatch")
    file_id, key = file_service.new_file_key(tenant_id, row.filename, param="filename")
    store.compose(key, [(part.key, part.size_bytes) for part in ordered])
    try:
        sha256, digest_md5 = _digests(store, key)
        if md5 is not None and digest_md5 != md5.lower():
            raise invalid(f"the parts put together have md5 {digest_md5}, not {md5.lower()}; the upload stays "
                          "pending", param="md5", code="md5_mismatch")
        file = file_service.register(
            session, store, tenant_id, file_id=file_id, key=key, filename=row.filename, purpose=row.purpose,
            size_bytes=total, sha256=sha256, tier=tier, expires_after_s=row.file_expires_after_s, settings=settings)
    except BaseException:
        store.delete_prefix(layout.file_prefix(tenant_id, file_id))
        raise
    row.status = "completed"
    row.file_id = file.file_id
    session.flush()
    store.delete_prefix(layout.upload_prefix(tenant_id, upload_id))
    return row


def _digests(store: ObjectStore, key: str) -> tuple[str, str]:
    sha256, md5 = hashlib.sha256(), hashlib.md5(usedforsecurity=False)
    with store.open_read(key) as handle:
        while chunk := handle.read(_READ_CHUNK_BYTES):
            sha256.update(chunk)
            md5.update(chunk)
    return sha256.hexdigest(), md5.hexdigest()


def cancel(session: Session, store: ObjectStore, tenant_id: str, upload_id: str) -> UploadRow:
    row = _locked(session, store, tenant_id, upload_id)
    if row.status == "cancelled":
        return row
    _require_pending(row, "cancelling applies")
    _end(store, row, "cancelled")
    return row


def _end(store: ObjectStore, row: UploadRow, status: str) -> None:
    row.status = status
    store.delete_prefix(layout.upload_prefix(row.tenant_id, row.upload_id))


def file_of(session: Session, row: UploadRow) -> FileRow | None:
    if row.file_id is None:
        return None
    try:
        return file_service.get(session, row.tenant_id, row.file_id)
    except ApiError:  # deleted (or expired) since
        return None


def parts_of(session: Session, store: ObjectStore, tenant_id: str, upload_id: str) -> list[UploadPartRow]:
    return upload_repo.parts(session, get(session, store, tenant_id, upload_id).upload_id)


def expire(session: Session, store: ObjectStore, now: float, limit: int = 500) -> int:
    """Every tenant's pending uploads past their hour: marked expired, their parts deleted."""
    rows = upload_repo.past_expiry(session, int(now), limit)
    for row in rows:
        _end(store, row, "expired")
    session.flush()
    return len(rows)
