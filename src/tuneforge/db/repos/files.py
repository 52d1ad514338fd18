from __future__ import annotations

from collections.abc import Collection
from typing import Any

from sqlalchemy import func, or_, select, update
from sqlalchemy.orm import Session

from tuneforge.db.pagination import Page, newest_first
from tuneforge.db.tables import FileRow
from tuneforge.db.tenancy import owned

_IDS_PER_QUERY = 500  # bound parameters per IN list (SQLite allows 32766, PostgreSQL 65535)


def get(session: Session, tenant_id: str, file_id: str) -> FileRow | None:
    return session.scalar(owned(FileRow, tenant_id).where(FileRow.file_id == file_id))


def page(
    session: Session, tenant_id: str, *, purpose: str | None, after: str | None, limit: int,
    ascending: bool = False, now: int | None = None,
) -> Page:
    stmt = owned(FileRow, tenant_id)
    if now is not None:  # an expired file is gone even before the sweep deletes it
        stmt = stmt.where(or_(FileRow.expires_at.is_(None), FileRow.expires_at > now))
    if purpose:
        stmt = stmt.where(FileRow.purpose == purpose)
    return newest_first(session, stmt, FileRow, FileRow.file_id, after, limit, ascending=ascending)


def expired(session: Session, now: int, limit: int) -> list[FileRow]:
    """Every tenant's files past their expiry (the housekeeping sweep's, not a tenant's, query)."""
    return list(session.scalars(select(FileRow).where(FileRow.expires_at <= now).order_by(FileRow.pk).limit(limit)))


def existing_ids(session: Session, tenant_id: str, file_ids: Collection[str]) -> set[str]:
    """Which of `file_ids` the tenant has a row for (the leftover sweep's question)."""
    found: set[str] = set()
    ordered = sorted(file_ids)
    for start in range(0, len(ordered), _IDS_PER_QUERY):
        chunk = ordered[start:start + _IDS_PER_QUERY]
        found.update(session.scalars(select(FileRow.file_id).where(FileRow.tenant_id == tenant_id,
                                                                   FileRow.file_id.in_(chunk))))
    return found


def newest_of_purpose(session: Session, tenant_id: str, purpose: str, limit: int) -> list[FileRow]:
    return list(session.scalars(select(FileRow).where(FileRow.tenant_id == tenant_id, FileRow.purpose == purpose)
                                .order_by(FileRow.pk.desc()).limit(limit)))


def count_of_purpose(session: Session, tenant_id: str, purpose: str) -> int:
    return int(session.scalar(select(func.count()).select_from(FileRow).where(
        FileRow.tenant_id == tenant_id, FileRow.purpose == purpose)) or 0)


def total_bytes(session: Session, tenant_id: str) -> int:
    """Bytes of the tenant's files, every purpose."""
    return int(session.scalar(select(func.coalesce(func.sum(FileRow.size_bytes), 0))
                              .where(FileRow.tenant_id == tenant_id)) or 0)


# ---- the claim on a file validated in the background (services/datasets/processing.py) ----------
# Each statement is one conditional UPDATE whose rowcount says whether it applied: two control
# plane processes (or PostgreSQL sessions) that race for the same file cannot both win, since
# the second UPDATE re-reads the row the first one changed and its WHERE no longer holds.

def claim_validation(session: Session, file_id: str, owner: str, now: float, stale_before: float) -> bool:
    """Take the validation of a processing file that nobody holds, that `owner` holds already, or
    whose holder has not renewed its claim since `stale_before`; counts a run. True when taken."""
    result = session.execute(
        update(FileRow)
        .where(FileRow.file_id == file_id, FileRow.status == "processing",
               or_(FileRow.validation_owner.is_(None), FileRow.validation_owner == owner,
                   FileRow.validation_heartbeat < stale_before))
        .values(validation_owner=owner, validation_heartbeat=now, validation_runs=FileRow.validation_runs + 1)
        .execution_options(synchronize_session=False))
    return _applied(result)


def renew_validation(session: Session, file_id: str, owner: str, now: float,
                     progress: dict[str, Any] | None) -> bool:
    """Renew `owner`'s claim (and record its progress when known); False when it holds it no longer."""
    values: dict[str, Any] = {"validation_heartbeat": now}
    if progress is not None:
        values["validation_progress"] = progress
    result = session.execute(
        update(FileRow)
        .where(FileRow.file_id == file_id, FileRow.status == "processing", FileRow.validation_owner == owner)
        .values(**values).execution_options(synchronize_session=False))
    return _applied(result)


def finish_validation(session: Session, file_id: str, owner: str | None, values: dict[str, Any]) -> bool:
    """Record the outcome (`status` and the report's fields in `values`) if `owner` still holds the
    claim (`owner` None: whoever holds it, for a file given up on); the claim ends."""
    stmt = update(FileRow).where(FileRow.file_id == file_id, FileRow.status == "processing")
    if owner is not None:
        stmt = stmt.where(FileRow.validation_owner == owner)
    result = session.execute(stmt.values(**values, validation_owner=None)
                             .execution_options(synchronize_session=False))
    return _applied(result)


def stale_validations(session: Session, stale_before: float, limit: int) -> list[FileRow]:
    """Every tenant's processing files whose claim nobody has renewed since `stale_before`, oldest
    first (the scheduler's duty's query, not a tenant's)."""
    return list(session.scalars(
        select(FileRow).where(FileRow.status == "processing",
                              or_(FileRow.validation_heartbeat.is_(None), FileRow.validation_heartbeat < stale_before))
        .order_by(FileRow.pk).limit(limit)))


def _applied(result: Any) -> bool:
    return bool(getattr(result, "rowcount", 0) == 1)
