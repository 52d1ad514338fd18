"""Files: upload (streamed to the object store, validated), list, delete, content."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import IO

from sqlalchemy.orm import Session

from tuneforge.db.pagination import Page
from tuneforge.db.repos import files as file_repo
from tuneforge.db.repos import jobs as job_repo
from tuneforge.db.repos import tenants as tenant_repo
from tuneforge.db.tables import FileRow
from tuneforge.domain.errors import ApiError, invalid, not_found
from tuneforge.domain.ids import new_id
from tuneforge.services.tenancy import quotas
from tuneforge.services.training import eval_sets
from tuneforge.settings import Settings
from tuneforge.storage import layout
from tuneforge.storage.store import ObjectStore

PURPOSES = ("fine-tune", "fine-tune-results", "batch", "assistants", "user_data", "evals")
UPLOADABLE = ("fine-tune", "batch", "assistants", "user_data", "evals")
MAX_FILENAME_CHARS = 256  # the column holds 512; a name is shown back in listings and headers
MIN_EXPIRY_S, MAX_EXPIRY_S = 3600, 30 * 24 * 3600  # expires_after.seconds, as OpenAI bounds it


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
    expires_after_s: int | None = None,
    settings: Settings | None = None,
) -> FileRow:
    """`settings`: the storage quotas to hold the tenant to (`quotas.check_file_bytes`)."""
    check_purpose(purpose)
    file_id, key = new_file_key(tenant_id, filename)
    if purpose == "evals":
        max_bytes = min(max_bytes, eval_sets.MAX_EVALS_FILE_BYTES)
    if settings is not None and (quota_bytes := settings.storage_quota(tier).file_bytes) is not None:
        max_bytes = min(max_bytes, quota_bytes)  # one file larger than the whole quota: 413 while it streams
    reader = _HashingReader(stream, max_bytes)
    try:
        store.put_stream(key, reader)
        return register(session, store, tenant_id, file_id=file_id, key=key, filename=filename, purpose=purpose,
                        size_bytes=reader.size_bytes, sha256=reader.digest.hexdigest(), tier=tier,
                        expires_after_s=expires_after_s, settings=settings)
    except BaseException:  # refused (size, quota, a bad evals file) or failed: no bytes stay behind
        store.delete_prefix(layout.file_prefix(tenant_id, file_id))
        raise


def check_purpose(purpose: str) -> None:
    if purpose not in UPLOADABLE:
        raise invalid(f"purpose must be one of {', '.join(UPLOADABLE)}; got {purpose!r}", param="purpose")


def new_file_key(tenant_id: str, filename: str, param: str = "file") -> tuple[str, str]:
    """A new file id and the key its bytes go to; 400 naming `param` for a name no file may have."""
    if not filename:
        raise invalid("the upload has no filename", param=param)
    _check_filename(filename, param)
    file_id = new_id("file")
    try:
        return file_id, layout.file_key(tenant_id, file_id, filename)
    except ValueError:  # ".", "..": names that are no file's
        raise invalid(f"{filename!r} cannot be a file's name", param=param, code="invalid_filename") from None


def check_expires_after(anchor: object, seconds: object, param: str = "expires_after") -> int:
    """OpenAI's file expiry policy: anchored at `created_at`, 1 hour to 30 days; the seconds."""
    if anchor != "created_at":
        raise invalid(f"{param}.anchor must be 'created_at'", param=f"{param}.anchor")
    try:
        value = int(seconds)  # a multipart form sends it as text
    except (TypeError, ValueError):
        value = None
    if value is None or isinstance(seconds, bool) or not MIN_EXPIRY_S <= value <= MAX_EXPIRY_S:
        raise invalid(f"{param}.seconds must be an integer between {MIN_EXPIRY_S} and {MAX_EXPIRY_S}",
                      param=f"{param}.seconds")
    return value


def register(
    session: Session, store: ObjectStore, tenant_id: str, *, file_id: str, key: str, filename: str, purpose: str,
    size_bytes: int, sha256: str, tier: str, expires_after_s: int | None, settings: Settings | None = None,
) -> FileRow:
    """The File of bytes already at `key`: `processing` when it is a fine-tune file (validated in
    the background once committed: `processing.settle`), checked when it is an evals file (400
    naming the line), and held to the tenant's storage quota when `settings` is given (403;
    counted under the tenant's lock, taken after the evals check so that no lock waits on it).
    `tier` is the tenant's, whose limits the background validation reads again."""
    now = int(time.time())
    row = FileRow(
        file_id=file_id,
        tenant_id=tenant_id,
        filename=filename,
        purpose=purpose,
        size_bytes=size_bytes,
        key=key,
        sha256=sha256,
        status="uploaded",
        created_at=now,
        expires_at=None if expires_after_s is None else now + expires_after_s,
    )
    if purpose == "fine-tune":
        # nobody holds it yet; the fresh heartbeat keeps the stale-claim duty off it for a lease
        row.status, row.validation_heartbeat, row.validation_runs = "processing", float(now), 0
        row.validation_progress = {"rows_checked": 0, "bytes_checked": 0, "bytes_total": size_bytes}
    else:
        if purpose == "evals":
            eval_sets.check_upload(session, store, tenant_id, key)
        row.status = "processed"
    if settings is not None:
        tenant = tenant_repo.lock(session, tenant_id)
        if tenant is not None:
            quotas.check_file_bytes(session, settings, tenant, size_bytes)
    session.add(row)
    session.flush()
    return row


def _check_filename(filename: str, param: str) -> None:
    if len(filename) > MAX_FILENAME_CHARS:
        raise invalid(f"the filename is longer than {MAX_FILENAME_CHARS} characters", param=param)
    if any(ord(ch) < 0x20 or 0xD800 <= ord(ch) <= 0xDFFF for ch in filename):
        raise invalid("the filename must not hold control characters or lone surrogates", param=param,
                      code="invalid_filename")


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
    if row is None or (row.expires_at is not None and row.expires_at <= time.time()):
        raise not_found(f"No such File object: {file_id}", param="file_id")
    return row


def list_files(
    session: Session, tenant_id: str, *, purpose: str | None, after: str | None, limit: int, order: str
) -> Page:
    if order not in ("asc", "desc"):
        raise invalid("order must be 'asc' or 'desc'", param="order")
    return file_repo.page(
        session, tenant_id, purpose=purpose, after=after, limit=limit, ascending=order == "asc", now=int(time.time())
    )


@dataclass
class Derived:
    """What deleting a file did to the data derived from it: the prepared datasets removed (each with
    its tokenized caches and reference log-probabilities, all kept under the dataset's prefix), and
    those kept because a job that has not ended still trains on them (the scheduler may yet launch
    or resume it); such a dataset goes when the file's last job has ended and the file is gone, or
    with the tenant."""

    removed: list[str] = field(default_factory=list)
    kept: list[dict[str, str]] = field(default_factory=list)  # {"dataset_id", "job_id"}


def delete(session: Session, store: ObjectStore, tenant_id: str, file_id: str) -> tuple[FileRow, Derived]:
    row = get(session, tenant_id, file_id)
    session.delete(row)
    session.flush()
    store.delete_prefix(layout.file_prefix(tenant_id, file_id))
    store.delete(layout.file_report_key(tenant_id, file_id))
    return row, _delete_derived(session, store, tenant_id, file_id)


def _delete_derived(session: Session, store: ObjectStore, tenant_id: str, file_id: str) -> Derived:
    """The prepared datasets of the jobs that used the file, but those an unfinished job still reads."""
    derived = Derived()
    in_use = {}
    for job in job_repo.unfinished(session, tenant_id):
        dataset_id = job.resolved.data.dataset_id if job.resolved is not None else None
        if dataset_id:
            in_use.setdefault(dataset_id, job.job_id)
    seen: set[str] = set()
    for job in job_repo.using_file(session, tenant_id, file_id):
        dataset_id = job.resolved.data.dataset_id if job.resolved is not None else None
        if not dataset_id or dataset_id in seen:
            continue
        seen.add(dataset_id)
        if dataset_id in in_use:
            derived.kept.append({"dataset_id": dataset_id, "job_id": in_use[dataset_id]})
        else:
            store.delete_prefix(layout.dataset_prefix(tenant_id, dataset_id))
            derived.removed.append(dataset_id)
    return derived


def delete_expired(session: Session, store: ObjectStore, now: float, limit: int = 500) -> int:
    """Files whose `expires_at` has passed, every tenant's: rows and bytes go. How many went."""
    rows = file_repo.expired(session, int(now), limit)
    for row in rows:
        session.delete(row)
        session.flush()
        store.delete_prefix(layout.file_prefix(row.tenant_id, row.file_id))
        store.delete(layout.file_report_key(row.tenant_id, row.file_id))
        _delete_derived(session, store, row.tenant_id, row.file_id)
    return len(rows)
