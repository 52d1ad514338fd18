"""A/B routes between model versions (/v1/routes), an extension."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from tuneforge.api.schemas.base import ApiObject, Number


class RouteVersionShare(ApiObject):
    model: str
    weight: int
    share: Number = Field(description="weight / the sum of the weights.")


class Route(ApiObject):
    id: str
    object: Literal["route"]
    name: str
    model: str = Field(description="What requests name as `model`: route:NAME.")
    versions: list[RouteVersionShare]
    created_at: int
    updated_at: int


class RouteList(ApiObject):
    object: Literal["list"]
    data: list[Route]


class RouteDeleted(ApiObject):
    id: str
    object: Literal["route"]
    name: str
    deleted: Literal[True]


class RouteFeedback(ApiObject):
    object: Literal["route.feedback"]
    route: str
    response_id: str
    model: str
    score: Number | None


class RouteStats(ApiObject):
    object: Literal["route.stats"]
    route: str
    since: int
    data: list[dict[str, Any]] = Field(description="Per version: weight, requests, errors, latency_ms, usage, "
                                                   "feedback.")
