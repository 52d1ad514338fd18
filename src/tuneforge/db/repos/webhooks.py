"""Webhook endpoints and the delivery outbox, including the dispatchers' claim.

The claim is the SQL that matters here: several control planes may poll one
database, and an event must reach its endpoint once per due attempt, not once
per control plane.
"""

from __future__ import annotations

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from tuneforge.db.pagination import Page, newest_first
from tuneforge.db.tables import WebhookDelivery, WebhookEndpoint
from tuneforge.db.tenancy import owned

PENDING, DELIVERED, FAILED = "pending", "delivered", "failed"


def get_endpoint(session: Session, tenant_id: str, endpoint_id: str) -> WebhookEndpoint | None:
    """A live (not deleted) endpoint of this tenant."""
    return session.scalar(owned(WebhookEndpoint, tenant_id).where(
        WebhookEndpoint.endpoint_id == endpoint_id, WebhookEndpoint.disabled_at.is_(None)))


def page_endpoints(session: Session, tenant_id: str, *, after: str | None, limit: int) -> Page:
    stmt = owned(WebhookEndpoint, tenant_id).where(WebhookEndpoint.disabled_at.is_(None))
    return newest_first(session, stmt, WebhookEndpoint, WebhookEndpoint.endpoint_id, after, limit)


def live_endpoints(session: Session, tenant_id: str) -> list[WebhookEndpoint]:
    stmt = owned(WebhookEndpoint, tenant_id).where(WebhookEndpoint.disabled_at.is_(None))
    return list(session.scalars(stmt.order_by(WebhookEndpoint.pk)))


def page_deliveries(session: Session, tenant_id: str, endpoint_id: str, *, after: str | None,
                    limit: int) -> Page:
    stmt = owned(WebhookDelivery, tenant_id).where(WebhookDelivery.endpoint_id == endpoint_id)
    return newest_first(session, stmt, WebhookDelivery, WebhookDelivery.delivery_id, after, limit)


def abandon_pending(session: Session, endpoint_id: str, reason: str) -> int:
    """Pending deliveries of a deleted endpoint fail at once instead of being retried."""
    result = session.execute(
        update(WebhookDelivery)
        .where(WebhookDelivery.endpoint_id == endpoint_id, WebhookDelivery.status == PENDING)
        .values(status=FAILED, last_error=reason))
    return result.rowcount or 0


def claim_due(session: Session, now: float, lease_until: float, limit: int) -> list[WebhookDelivery]:
    """Take up to `limit` due deliveries for this dispatcher and count the attempt.

    PostgreSQL: `FOR UPDATE SKIP LOCKED` lets concurrent dispatchers take disjoint
    rows without waiting on each other. Every backend: the UPDATE repeats the
    "still due" condition, so of two dispatchers that selected the same row (SQLite
    has no row locks) only the one whose UPDATE matched owns it; it pushes
    `next_attempt_at` to `lease_until`, past the end of its send, and commits before
    sending. A dispatcher that dies mid-send loses the row when the lease runs out.
    """
    stmt = (select(WebhookDelivery.pk)
            .where(WebhookDelivery.status == PENDING, WebhookDelivery.next_attempt_at <= now)
            .order_by(WebhookDelivery.next_attempt_at, WebhookDelivery.pk)
            .limit(limit))
    if session.get_bind().dialect.name == "postgresql":
        stmt = stmt.with_for_update(skip_locked=True)
    claimed: list[int] = []
    for pk in list(session.scalars(stmt)):
        result = session.execute(
            update(WebhookDelivery)
            .where(WebhookDelivery.pk == pk, WebhookDelivery.status == PENDING,
                   WebhookDelivery.next_attempt_at <= now)
            .values(next_attempt_at=lease_until, attempts=WebhookDelivery.attempts + 1)
            .execution_options(synchronize_session=False))
        if result.rowcount == 1:
            claimed.append(pk)
    if not claimed:
        return []
    rows = session.scalars(select(WebhookDelivery).where(WebhookDelivery.pk.in_(claimed))
                           .order_by(WebhookDelivery.pk).execution_options(populate_existing=True))
    return list(rows)


def endpoints_by_id(session: Session, endpoint_ids: set[str]) -> dict[str, WebhookEndpoint]:
    """Platform-side lookup (the dispatcher), deleted endpoints included."""
    if not endpoint_ids:
        return {}
    rows = session.scalars(select(WebhookEndpoint).where(WebhookEndpoint.endpoint_id.in_(endpoint_ids)))
    return {row.endpoint_id: row for row in rows}


def record_attempt(session: Session, delivery_id: str, attempt: int, values: dict) -> bool:
    """Store the outcome of attempt number `attempt`, unless the row moved on meanwhile (its
    lease ran out and another dispatcher claimed it, which counted a further attempt, or its
    endpoint was deleted): then that newer state stands."""
    result = session.execute(
        update(WebhookDelivery)
        .where(WebhookDelivery.delivery_id == delivery_id, WebhookDelivery.status == PENDING,
               WebhookDelivery.attempts == attempt)
        .values(**values)
        .execution_options(synchronize_session=False))
    return result.rowcount == 1


def all_endpoints(session: Session) -> list[WebhookEndpoint]:
    """Every tenant's endpoints, deleted ones included (key rotation only)."""
    return list(session.scalars(select(WebhookEndpoint).order_by(WebhookEndpoint.pk)))


def deliveries_by_status(session: Session) -> dict[str, int]:
    """status -> how many deliveries have it, every tenant's (platform-wide on purpose: a counter of
    /metrics). Statuses without deliveries are absent."""
    rows = session.execute(select(WebhookDelivery.status, func.count()).group_by(WebhookDelivery.status))
    return {status: count for status, count in rows}
