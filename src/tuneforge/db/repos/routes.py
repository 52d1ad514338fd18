from __future__ import annotations

from sqlalchemy import case, delete, func, select
from sqlalchemy.orm import Session

from tuneforge.db.tables import Route, RouteRequest
from tuneforge.db.tenancy import owned


def get(session: Session, tenant_id: str, name: str) -> Route | None:
    return session.scalar(owned(Route, tenant_id).where(Route.name == name))


def of_tenant(session: Session, tenant_id: str) -> list[Route]:
    return list(session.scalars(owned(Route, tenant_id).order_by(Route.pk)))


def using(session: Session, tenant_id: str, model_id: str) -> list[Route]:
    """The tenant's routes that send `model_id` traffic (a version with a positive weight)."""
    return [route for route in of_tenant(session, tenant_id)
            if any(v["model"] == model_id and v["weight"] > 0 for v in route.versions)]


def all_routes(session: Session) -> list[Route]:
    return list(session.scalars(select(Route).order_by(Route.pk)))


def request(session: Session, tenant_id: str, route_id: str, response_id: str) -> RouteRequest | None:
    return session.scalar(owned(RouteRequest, tenant_id).where(RouteRequest.route_id == route_id,
                                                               RouteRequest.response_id == response_id))


def requests_since(session: Session, route_id: str, since: int, limit: int) -> list[RouteRequest]:
    """The route's newest requests since `since` (unix seconds), at most `limit`."""
    return list(session.scalars(select(RouteRequest).where(
        RouteRequest.route_id == route_id, RouteRequest.created_at >= since)
        .order_by(RouteRequest.pk.desc()).limit(limit)))


def delete_requests(session: Session, route_id: str) -> None:
    session.execute(delete(RouteRequest).where(RouteRequest.route_id == route_id))


def prune_requests(session: Session, before: int) -> int:
    return session.execute(delete(RouteRequest).where(RouteRequest.created_at < before)).rowcount or 0


def totals(session: Session, route_id: str, since: int) -> list[tuple]:
    """Per version since `since`: (model, requests, errors, mean latency ms, mean first-token ms,
    prompt tokens, completion tokens, feedback count, mean feedback)."""
    failed = case((RouteRequest.outcome == "error", 1), else_=0)
    return [tuple(row) for row in session.execute(
        select(RouteRequest.model, func.count(), func.sum(failed), func.avg(RouteRequest.latency_ms),
               func.avg(RouteRequest.first_token_ms), func.sum(RouteRequest.prompt_tokens),
               func.sum(RouteRequest.completion_tokens), func.count(RouteRequest.feedback),
               func.avg(RouteRequest.feedback))
        .where(RouteRequest.route_id == route_id, RouteRequest.created_at >= since)
        .group_by(RouteRequest.model))]
