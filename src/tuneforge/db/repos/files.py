from __future__ import annotations

from sqlalchemy.orm import Session

from tuneforge.db.pagination import Page, newest_first
from tuneforge.db.tables import FileRow
from tuneforge.db.tenancy import owned


def get(session: Session, tenant_id: str, file_id: str) -> FileRow | None:
    return session.scalar(owned(FileRow, tenant_id).where(FileRow.file_id == file_id))


def page(
    session: Session, tenant_id: str, *, purpose: str | None, after: str | None, limit: int,
    ascending: bool = False,
) -> Page:
    stmt = owned(FileRow, tenant_id)
    if purpose:
        stmt = stmt.where(FileRow.purpose == purpose)
    return newest_first(session, stmt, FileRow, FileRow.file_id, after, limit, ascending=ascending)
