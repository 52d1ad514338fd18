from __future__ import annotations

from collections.abc import Collection

from sqlalchemy import func, or_, select
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
