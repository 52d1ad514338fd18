"""/v1/routes — A/B routes between model versions (an extension; services/serving/routes.py).

A route is used as `model: "route:NAME"` in chat and completion requests. Its
versions split the traffic by weight; a request's `user` keeps one user on one
version. The answer's `model` (and the `X-Tuneforge-Model` header) names the
version that served it; `POST /v1/routes/{name}/feedback` scores an answer by its
id; `GET /v1/routes/{name}/stats` compares the versions.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, ConfigDict, Field

from tuneforge.api import deps
from tuneforge.api.limits import MAX_ID_CHARS, Int64
from tuneforge.api.openapi import error_responses
from tuneforge.api.schemas.base import ObjectRoute
from tuneforge.api.schemas.traffic import Route as RouteObject
from tuneforge.api.schemas.traffic import RouteDeleted, RouteList, RouteStats
from tuneforge.api.schemas.traffic import RouteFeedback as RouteFeedbackObject
from tuneforge.db import Session
from tuneforge.db.tables import Route, Tenant
from tuneforge.serve.vllm import serving_changed
from tuneforge.services.context import Platform
from tuneforge.services.serving import routes as route_service

router = APIRouter(prefix="/v1/routes", tags=["routes"], route_class=ObjectRoute)
TENANT = Depends(deps.tenant)
PLATFORM = Depends(deps.platform)
MAX_SCORE = 1_000.0


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class RouteVersion(_Body):
    model: str = Field(max_length=MAX_ID_CHARS, description="A fine-tuned model whose gates passed, or a base model.")
    weight: Int64 = Field(description=f"0-{route_service.MAX_WEIGHT}: its share is weight / the sum of weights.")


class RouteCreate(_Body):
    name: str = Field(max_length=64, description="Requests use it as model: \"route:NAME\".")
    versions: list[RouteVersion] = Field(max_length=route_service.MAX_VERSIONS)


class RouteUpdate(_Body):
    versions: list[RouteVersion] = Field(max_length=route_service.MAX_VERSIONS,
                                         description="The new versions and weights (replacing the old).")


class RoutePromote(_Body):
    model: str = Field(max_length=MAX_ID_CHARS, description="The version to promote (it joins the route if new).")
    weight: Int64 = Field(route_service.PROMOTED_TOTAL, description="Its share in percent (1-100, default 100); "
                                                                    "the others share the rest in proportion.")


class RouteFeedback(_Body):
    response_id: str = Field(max_length=64, description="The id of an answer the route gave (chatcmpl-…, cmpl-…).")
    score: float = Field(ge=-MAX_SCORE, le=MAX_SCORE, description="Any scale the tenant chooses (e.g. 1 and -1, "
                                                                  "or 0-5); a later score replaces this one.")


def route_object(route: Route) -> dict[str, Any]:
    total = sum(v["weight"] for v in route.versions) or 1
    return {"id": route.route_id, "object": "route", "name": route.name, "model": route_service.PREFIX + route.name,
            "versions": [{"model": v["model"], "weight": v["weight"], "share": round(v["weight"] / total, 6)}
                         for v in route.versions],
            "created_at": route.created_at, "updated_at": route.updated_at}


def _versions(body: RouteCreate | RouteUpdate) -> list[dict[str, Any]]:
    return [version.model_dump() for version in body.versions]


@router.post("", response_model=RouteObject, responses=error_responses(404, 409))
def create_route(body: RouteCreate, tenant: Tenant = TENANT, session: Session = deps.SESSION,
                 platform: Platform = PLATFORM) -> dict:
    route = route_service.create(session, tenant.tenant_id, body.name, _versions(body))
    session.commit()  # stored before the vLLM servers are brought in line
    serving_changed(platform, session)
    return route_object(route)


@router.get("", response_model=RouteList)
def list_routes(tenant: Tenant = TENANT, session: Session = deps.SESSION) -> dict:
    return {"object": "list", "data": [route_object(r) for r in route_service.listing(session, tenant.tenant_id)]}


@router.get("/{name}", response_model=RouteObject)
def retrieve_route(name: str, tenant: Tenant = TENANT, session: Session = deps.SESSION) -> dict:
    return route_object(route_service.get(session, tenant.tenant_id, name))


@router.patch("/{name}", response_model=RouteObject, responses=error_responses(409))
def update_route(name: str, body: RouteUpdate, tenant: Tenant = TENANT, session: Session = deps.SESSION,
                 platform: Platform = PLATFORM) -> dict:
    route = route_service.update(session, tenant.tenant_id, name, _versions(body))
    session.commit()  # stored before the vLLM servers are brought in line
    serving_changed(platform, session)
    return route_object(route)


@router.delete("/{name}", response_model=RouteDeleted)
def delete_route(name: str, tenant: Tenant = TENANT, session: Session = deps.SESSION,
                 platform: Platform = PLATFORM) -> dict:
    route = route_service.delete(session, tenant.tenant_id, name)
    session.commit()  # stored before the vLLM servers are brought in line
    serving_changed(platform, session)
    return {"id": route.route_id, "object": "route", "name": route.name, "deleted": True}


@router.post("/{name}/promote", response_model=RouteObject, responses=error_responses(409))
def promote_version(name: str, body: RoutePromote, tenant: Tenant = TENANT, session: Session = deps.SESSION,
                    platform: Platform = PLATFORM) -> dict:
    route = route_service.promote(session, tenant.tenant_id, name, body.model, body.weight)
    session.commit()  # stored before the vLLM servers are brought in line
    serving_changed(platform, session)
    return route_object(route)


@router.post("/{name}/feedback", response_model=RouteFeedbackObject)
def give_feedback(name: str, body: RouteFeedback, tenant: Tenant = TENANT, session: Session = deps.SESSION) -> dict:
    row = route_service.feedback(session, tenant.tenant_id, name, body.response_id, body.score)
    return {"object": "route.feedback", "route": name, "response_id": row.response_id, "model": row.model,
            "score": row.feedback}


@router.get("/{name}/stats", response_model=RouteStats)
def route_stats(name: str, since: Int64 | None = Query(None, description="Unix seconds; default: the last 7 days."),
                tenant: Tenant = TENANT, session: Session = deps.SESSION) -> dict:
    route = route_service.get(session, tenant.tenant_id, name)
    start = int(time.time()) - 7 * 86_400 if since is None else max(0, int(since))
    return {"object": "route.stats", "route": route.name, "since": start,
            "data": route_service.stats(session, route, start)}
