from __future__ import annotations

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from tuneforge.db.pagination import Page, newest_first
from tuneforge.db.tables import FileRow
from tuneforge.db.tenancy import owned


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
