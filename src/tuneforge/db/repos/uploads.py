from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from tuneforge.db.tables import UploadPartRow, UploadRow
from tuneforge.db.tenancy import owned


def get(session: Session, tenant_id: str, upload_id: str, *, fresh: bool = False) -> UploadRow | None:
    """`fresh`: read again from the database, not the session's copy (after taking a lock)."""
    stmt = owned(UploadRow, tenant_id).where(UploadRow.upload_id == upload_id)
    if fresh:
        stmt = stmt.execution_options(populate_existing=True)
    return session.scalar(stmt)


def count_pending(session: Session, tenant_id: str, now: int) -> int:
    return session.scalar(select(func.count()).select_from(UploadRow).where(
        UploadRow.tenant_id == tenant_id, UploadRow.status == "pending", UploadRow.expires_at > now)) or 0


def parts(session: Session, upload_id: str) -> list[UploadPartRow]:
    """The parts of an upload already found to be the caller's, in the order they arrived."""
    return list(session.scalars(select(UploadPartRow).where(UploadPartRow.upload_id == upload_id)
                                .order_by(UploadPartRow.pk)))


def count_parts(session: Session, upload_id: str) -> int:
    return session.scalar(select(func.count()).select_from(UploadPartRow)
                          .where(UploadPartRow.upload_id == upload_id)) or 0


def past_expiry(session: Session, now: int, limit: int) -> list[UploadRow]:
    """Every tenant's pending uploads past their expiry (the housekeeping sweep's query)."""
    return list(session.scalars(select(UploadRow).where(UploadRow.status == "pending", UploadRow.expires_at <= now)
                                .order_by(UploadRow.pk).limit(limit)))


def pending_totals(session: Session, tenant_id: str, now: int) -> tuple[int, int, int | None]:
    """(how many, bytes declared, the soonest expiry) of the tenant's unexpired pending uploads."""
    row = session.execute(
        select(func.count(), func.coalesce(func.sum(UploadRow.size_bytes), 0), func.min(UploadRow.expires_at))
        .where(UploadRow.tenant_id == tenant_id, UploadRow.status == "pending", UploadRow.expires_at > now)).one()
    return int(row[0]), int(row[1]), None if row[2] is None else int(row[2])
