"""/v1/webhooks — a tenant's endpoints for job outcomes, and their deliveries for debugging.

Not part of OpenAI's API (its webhooks are configured in a dashboard); the events
and their signatures are OpenAI's, so receivers written for it work unchanged.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, ConfigDict, Field

from tuneforge.api import deps
from tuneforge.api.limits import MAX_ID_CHARS, MAX_LIST_ITEMS
from tuneforge.api.objects import list_object
from tuneforge.api.schemas.base import ObjectRoute
from tuneforge.api.schemas.webhooks import (
    WebhookDeleted,
    WebhookDeliveryList,
    WebhookEndpointList,
)
from tuneforge.api.schemas.webhooks import WebhookEndpoint as EndpointObject
from tuneforge.db import Session
from tuneforge.db.tables import Tenant, WebhookDelivery, WebhookEndpoint
from tuneforge.security import egress
from tuneforge.security.egress import EgressPolicy
from tuneforge.services.context import Platform
from tuneforge.services.webhooks import delivery as webhook_delivery
from tuneforge.services.webhooks import subscriptions as webhook_service

router = APIRouter(prefix="/v1/webhooks", tags=["webhooks"], route_class=ObjectRoute)
TENANT = Depends(deps.tenant)


class WebhookCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # the service checks the length (code invalid_url); the schema states it
    url: str = Field(json_schema_extra={"maxLength": egress.MAX_URL_CHARS},
                     description="http:// or https:// URL that receives the events (POST, JSON)")
    events: list[Annotated[str, Field(max_length=MAX_ID_CHARS)]] | None = Field(
        default=None, max_length=MAX_LIST_ITEMS,
        description="event types to receive; default all: " + ", ".join(webhook_service.ALL_EVENTS))


class WebhookUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str | None = Field(default=None, description="new receiving URL; omitted: unchanged")
    events: list[str] | None = Field(default=None, description="new event types; omitted: unchanged")


def endpoint_object(row: WebhookEndpoint, *, secret: str | None = None) -> dict[str, Any]:
    present = {"id": row.endpoint_id, "object": "webhook_endpoint", "url": row.url,
               "events": list(row.event_types or []), "created_at": row.created_at}
    if secret is not None:  # shown when created, never again: the tenant stores it to verify signatures
        present["secret"] = secret
    return present


def delivery_object(row: WebhookDelivery) -> dict[str, Any]:
    pending = webhook_service.is_pending(row)
    return {"id": row.delivery_id, "object": "webhook_delivery", "endpoint_id": row.endpoint_id,
            "type": row.event_type, "status": row.status, "attempts": row.attempts,
            "last_status_code": row.last_status_code,
            "last_error": webhook_delivery.shown_reason(row.last_error, row.last_status_code),
            "created_at": row.created_at, "delivered_at": row.delivered_at,
            "next_attempt_at": int(row.next_attempt_at) if pending else None,
            "event": row.payload}


@router.post("", response_model=EndpointObject)
def create_webhook(body: WebhookCreate, tenant: Tenant = TENANT, session: Session = deps.SESSION,
                   egress: EgressPolicy = deps.EGRESS, platform: Platform = Depends(deps.platform)) -> dict:
    row, secret = webhook_service.register(session, tenant.tenant_id, body.url, body.events, egress=egress,
                                           sealer=platform.sealer)
    return endpoint_object(row, secret=secret)


@router.get("", response_model=WebhookEndpointList)
def list_webhooks(
    after: str | None = Query(default=None, max_length=MAX_ID_CHARS),
    limit: int = Query(default=20, ge=1, le=100),
    tenant: Tenant = TENANT,
    session: Session = deps.SESSION,
) -> dict:
    page = webhook_service.list_endpoints(session, tenant.tenant_id, after=after, limit=limit)
    return list_object(page.rows, endpoint_object, page.has_more)


@router.get("/{webhook_id}", response_model=EndpointObject)
def retrieve_webhook(webhook_id: str, tenant: Tenant = TENANT,
                     session: Session = deps.SESSION) -> dict:
    return endpoint_object(webhook_service.get(session, tenant.tenant_id, webhook_id))


@router.post("/{webhook_id}", response_model=EndpointObject)
def update_webhook(webhook_id: str, body: WebhookUpdate, tenant: Tenant = TENANT,
                   session: Session = deps.SESSION, egress: EgressPolicy = deps.EGRESS) -> dict:
    row = webhook_service.update(session, tenant.tenant_id, webhook_id, egress=egress, url=body.url,
                                 events=body.events)
    return endpoint_object(row)


@router.delete("/{webhook_id}", response_model=WebhookDeleted)
def delete_webhook(webhook_id: str, tenant: Tenant = TENANT,
                   session: Session = deps.SESSION) -> dict:
    row = webhook_service.delete(session, tenant.tenant_id, webhook_id)
    return {"id": row.endpoint_id, "object": "webhook_endpoint", "deleted": True}


@router.get("/{webhook_id}/deliveries", response_model=WebhookDeliveryList)
def list_deliveries(
    webhook_id: str,
    after: str | None = Query(default=None, max_length=MAX_ID_CHARS),
    limit: int = Query(default=20, ge=1, le=100),
    tenant: Tenant = TENANT,
    session: Session = deps.SESSION,
) -> dict:
    """Newest first: each event's status, attempts so far and the last answer, to debug a receiver."""
    page = webhook_service.list_deliveries(session, tenant.tenant_id, webhook_id, after=after, limit=limit)
    return list_object(page.rows, delivery_object, page.has_more)
