"""The audit log: appended, read by the operator, never updated or deleted (there is deliberately
no such function here; PostgreSQL's trigger refuses it too, see migration 0016)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from tuneforge.db.pagination import MAX_LIMIT
from tuneforge.db.tables import AuditRecord

MAX_SUMMARY_KEYS = 16
MAX_SUMMARY_VALUE_CHARS = 200


@dataclass(frozen=True)
class Entry:
    """What one audit row says; `summary` is bounded by `bounded` before it is stored."""

    actor: str  # tenant | admin | platform
    action: str
    resource_type: str
    resource_id: str | None = None
    tenant_id: str | None = None
    key_id: str | None = None
    status_code: int | None = None
    request_id: str | None = None
    summary: dict[str, Any] | None = None


def bounded(summary: dict[str, Any] | None) -> dict[str, Any] | None:
    """At most `MAX_SUMMARY_KEYS` scalar values, strings cut to `MAX_SUMMARY_VALUE_CHARS`."""
    if not summary:
        return None
    kept: dict[str, Any] = {}
    for key, value in list(summary.items())[:MAX_SUMMARY_KEYS]:
        if isinstance(value, str):
            value = value[:MAX_SUMMARY_VALUE_CHARS]
        elif not isinstance(value, (int, float, bool)) and value is not None:
            value = str(value)[:MAX_SUMMARY_VALUE_CHARS]
        kept[str(key)[:64]] = value
    return kept


def append(session: Session, entry: Entry, *, now: float | None = None) -> AuditRecord:
    row = AuditRecord(
        created_at=time.time() if now is None else now, actor=entry.actor[:16], tenant_id=entry.tenant_id,
        key_id=entry.key_id, action=entry.action[:128], resource_type=entry.resource_type[:64],
        resource_id=None if entry.resource_id is None else entry.resource_id[:256],
        status_code=entry.status_code, request_id=entry.request_id, summary=bounded(entry.summary))
    session.add(row)
    return row


def page(session: Session, *, tenant_id: str | None = None, resource_id: str | None = None,
         action: str | None = None, after: int | None = None, limit: int = 100) -> tuple[list[AuditRecord], bool]:
    """Rows oldest first (a life reads in order), after the row numbered `after`; and whether more follow."""
    limit = max(1, min(int(limit), MAX_LIMIT))
    stmt = select(AuditRecord)
    if tenant_id is not None:
        stmt = stmt.where(AuditRecord.tenant_id == tenant_id)
    if resource_id is not None:
        stmt = stmt.where(AuditRecord.resource_id == resource_id)
    if action is not None:
        stmt = stmt.where(AuditRecord.action == action)
    if after is not None:
        stmt = stmt.where(AuditRecord.pk > after)
    rows = list(session.scalars(stmt.order_by(AuditRecord.pk.asc()).limit(limit + 1)))
    return rows[:limit], len(rows) > limit
