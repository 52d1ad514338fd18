"""Webhook endpoints and their deliveries (/v1/webhooks), an extension."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from tuneforge.api.schemas.base import ApiObject, Deleted, Number, Page


class WebhookEndpoint(ApiObject):
    id: str
    object: Literal["webhook_endpoint"]
    url: str
    events: list[str]
    created_at: int
    secret: str | None = Field(default=None, description="The signing secret: in the answer to the create only.")


class WebhookEndpointList(Page):
    data: list[WebhookEndpoint]


class WebhookDeleted(Deleted):
    object: Literal["webhook_endpoint"]


class WebhookDelivery(ApiObject):
    id: str
    object: Literal["webhook_delivery"]
    endpoint_id: str
    type: str
    status: str
    attempts: int
    last_status_code: int | None
    last_error: str | None
    created_at: int
    delivered_at: Number | None
    next_attempt_at: int | None
    event: dict[str, Any] | None = Field(description="The event as sent (OpenAI's webhook event).")


class WebhookDeliveryList(Page):
    """Newest first."""

    data: list[WebhookDelivery]
