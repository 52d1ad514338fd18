"""A/B routes: a tenant splits the traffic of one name between model versions by weight.

A request names a route as `model: "route:NAME"`; `serve/routing.py` picks the version (by
weight, or by the request's `user` so that one user always gets the same one). The answer says
which version served (its `model` field), and every routed request is recorded with its
version, outcome, latency and tokens; the tenant can score an answer later by its id. Only a
version that may take production traffic can be given weight: a fine-tuned model whose gates
passed (or an admin let into staging or production), not archived and not deleted, or a base
model (the control arm). A model with weight in a route cannot be deleted or archived until the
route stops sending it traffic; a version at weight 0 may stay in the route after that.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from tuneforge.db.engine import savepoint
from tuneforge.db.repos import base_models as base_model_repo
from tuneforge.db.repos import models as model_repo
from tuneforge.db.repos import routes as repo
from tuneforge.db.repos import tenants as tenant_repo
from tuneforge.db.tables import FineTunedModel, Route, RouteRequest
from tuneforge.domain.errors import ApiError, conflict, invalid, not_found
from tuneforge.domain.ids import new_id
from tuneforge.registry import models as registry_models
from tuneforge.registry.stages import GATED
from tuneforge.serve import routing

PREFIX = "route:"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
MAX_ROUTES_PER_TENANT = 100
MAX_VERSIONS = 8
MAX_WEIGHT = 1_000_000
PROMOTED_TOTAL = 100  # a promotion rewrites the weights as percentages
PERCENTILE_SAMPLE = 10_000  # latency percentiles: over the newest this many requests of the window
OUTCOMES = ("ok", "error", "cancelled")


@dataclass(frozen=True)
class Choice:
    route: Route
    model: str


def route_name(model: str) -> str | None:
    """NAME when a request's `model` is `route:NAME`, else None."""
    return model[len(PREFIX):] if model.startswith(PREFIX) else None


def route_not_found(name: str) -> ApiError:
    return not_found(f"The route '{name}' does not exist", param="model", code="route_not_found")


def get(session: Session, tenant_id: str, name: str) -> Route:
    route = repo.get(session, tenant_id, name)
    if route is None:
        raise route_not_found(name)
    return route


def listing(session: Session, tenant_id: str) -> list[Route]:
    return repo.of_tenant(session, tenant_id)


def create(session: Session, tenant_id: str, name: str, versions: Sequence[Mapping[str, Any]]) -> Route:
    if not NAME.fullmatch(name):
        raise invalid("name must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit",
                      param="name")
    checked = check_versions(session, tenant_id, versions)
    tenant_repo.lock(session, tenant_id)  # the count and the insert cannot race another create
    if repo.get(session, tenant_id, name) is not None:
        raise conflict(f"a route named '{name}' exists already", param="name", code="route_exists")
    if len(repo.of_tenant(session, tenant_id)) >= MAX_ROUTES_PER_TENANT:
        raise invalid(f"a tenant can have at most {MAX_ROUTES_PER_TENANT} routes; delete one first", param="name",
                      code="too_many_routes")
    now = int(time.time())
    route = Route(route_id=new_id("route", sep="_"), tenant_id=tenant_id, name=name, versions=checked,
                  created_at=now, updated_at=now)
    try:
        with savepoint(session):
            session.add(route)
            session.flush()
    except IntegrityError:  # created by another process between the read and the insert
        raise conflict(f"a route named '{name}' exists already", param="name", code="route_exists") from None
    return route


def update(session: Session, tenant_id: str, name: str, versions: Sequence[Mapping[str, Any]]) -> Route:
    route = get(session, tenant_id, name)
    route.versions = check_versions(session, tenant_id, versions)
    route.updated_at = int(time.time())
    return route


def delete(session: Session, tenant_id: str, name: str) -> Route:
    route = get(session, tenant_id, name)
    repo.delete_requests(session, route.route_id)
    session.delete(route)
    return route


def promote(session: Session, tenant_id: str, name: str, model: str, share: int = PROMOTED_TOTAL) -> Route:
    """Give `model` `share` percent of the route's traffic; the other versions share the rest in
    proportion to their weights now (equally when none has any). A model not yet in the route
    joins it."""
    route = get(session, tenant_id, name)
    if not 0 < share <= PROMOTED_TOTAL:
        raise invalid(f"weight must be between 1 and {PROMOTED_TOTAL} (percent)", param="weight")
    others = [dict(v) for v in route.versions if v["model"] != model]
    rest = PROMOTED_TOTAL - share
    weights = _apportion(rest, [v["weight"] for v in others] if any(v["weight"] for v in others)
                         else [1] * len(others))
    if rest and not others:
        raise invalid(f"{model} is the route's only version: it takes all its traffic", param="weight")
    promoted = [{"model": model, "weight": share}] + [{**v, "weight": w} for v, w in zip(others, weights)]
    order = [v["model"] for v in route.versions]  # the versions keep their places (sticky users stay put)
    promoted.sort(key=lambda v: order.index(v["model"]) if v["model"] in order else len(order))
    route.versions = check_versions(session, tenant_id, promoted)
    route.updated_at = int(time.time())
    return route


def _apportion(total: int, weights: Sequence[int]) -> list[int]:
    """`total` split in proportion to `weights` as integers that sum to it (largest remainders)."""
    whole = sum(weights)
    if not weights or whole == 0:
        return [0] * len(weights)
    exact = [total * w / whole for w in weights]
    shares = [int(x) for x in exact]
    by_remainder = sorted(range(len(weights)), key=lambda i: (shares[i] - exact[i], i))
    for index in by_remainder[:total - sum(shares)]:
        shares[index] += 1
    return shares


def check_versions(session: Session, tenant_id: str, versions: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    if not 1 <= len(versions) <= MAX_VERSIONS:
        raise invalid(f"a route has 1 to {MAX_VERSIONS} versions", param="versions")
    checked: list[dict[str, Any]] = []
    for index, version in enumerate(versions):
        model, weight = version.get("model"), version.get("weight")
        param = f"versions.{index}"
        if not isinstance(model, str) or not model:
            raise invalid(f"{param}.model must be a model id", param=f"{param}.model")
        if isinstance(weight, bool) or not isinstance(weight, int) or not 0 <= weight <= MAX_WEIGHT:
            raise invalid(f"{param}.weight must be an integer between 0 and {MAX_WEIGHT}", param=f"{param}.weight")
        if any(model == seen["model"] for seen in checked):
            raise invalid(f"{param}.model: {model} is in the route twice", param=f"{param}.model")
        if route_name(model) is not None:
            raise invalid(f"{param}.model: a route cannot send traffic to another route", param=f"{param}.model")
        if base_model_repo.by_name(session, model) is None:
            row = model_repo.get(session, tenant_id, model)
            # a version without weight takes no traffic: it only has to be (or have been) a model of the tenant
            refusal = traffic_refusal(row, model) if weight > 0 or row is None else None
            if refusal is not None:
                raise ApiError(refusal.status_code, f"{param}.model: {refusal.message}", param=f"{param}.model",
                               code=refusal.code)
        checked.append({"model": model, "weight": weight})
    if sum(v["weight"] for v in checked) <= 0:
        raise invalid("a route needs a version with a positive weight", param="versions")
    return checked


def traffic_refusal(row: FineTunedModel | None, model: str) -> ApiError | None:
    """Why a fine-tuned model may not take production traffic, or None when it may."""
    if row is None or row.deprecated_at is not None or row.artifacts_deleted_at is not None:
        return not_found(f"the model '{model}' does not exist", param="model", code="model_not_found")
    if row.stage == "archived":
        return conflict(f"{model} is archived; move it back to dev first", param="model", code="model_archived")
    if row.stage not in GATED and not registry_models.evaluated(row):
        return conflict(f"{model} was not evaluated and cannot take production traffic", param="model",
                        code="model_not_evaluated")
    if not (row.promotable or row.stage in GATED):
        return conflict(f"{model} failed its eval gates and cannot take production traffic", param="model",
                        code="gates_failed")
    return None


def choose(session: Session, tenant_id: str, name: str, user: str | None) -> Choice:
    """The version that serves a request for `route:NAME`. A version that can no longer take
    traffic (deleted, archived, or its gates overridden away) is passed over."""
    route = get(session, tenant_id, name)
    live = [routing.Version(v["model"], v["weight"]) for v in route.versions if v["weight"] > 0
            and (base_model_repo.by_name(session, v["model"]) is not None
                 or traffic_refusal(model_repo.get(session, tenant_id, v["model"]), v["model"]) is None)]
    if not live:
        raise conflict(f"no version of the route '{name}' can take traffic now", param="model",
                       code="route_unavailable")
    return Choice(route, routing.pick(route.route_id, live, user).model)


def record(session: Session, choice: Choice, response_id: str, *, outcome: str, latency_ms: float,
           first_token_ms: float | None = None, prompt_tokens: int = 0, completion_tokens: int = 0) -> None:
    session.add(RouteRequest(response_id=response_id, route_id=choice.route.route_id,
                             tenant_id=choice.route.tenant_id, model=choice.model, outcome=outcome,
                             latency_ms=round(latency_ms, 3), first_token_ms=None if first_token_ms is None
                             else round(first_token_ms, 3), prompt_tokens=prompt_tokens,
                             completion_tokens=completion_tokens, created_at=int(time.time())))


def feedback(session: Session, tenant_id: str, name: str, response_id: str, score: float) -> RouteRequest:
    """Score the answer `response_id` (its `id`) gave; a later score replaces an earlier one."""
    route = get(session, tenant_id, name)
    row = repo.request(session, tenant_id, route.route_id, response_id)
    if row is None:
        raise not_found(f"the route '{name}' served no response '{response_id}'", param="response_id",
                        code="response_not_found")
    row.feedback = score
    return row


def stats(session: Session, route: Route, since: int = 0) -> list[dict[str, Any]]:
    """Per version (the route's own first, then any it no longer has that served in the window):
    requests, errors, latency, tokens and feedback since `since`."""
    latencies: dict[str, list[float]] = {}
    for row in repo.requests_since(session, route.route_id, since, PERCENTILE_SAMPLE):
        latencies.setdefault(row.model, []).append(row.latency_ms)
    totals = {row[0]: row for row in repo.totals(session, route.route_id, since)}
    weights = {v["model"]: v["weight"] for v in route.versions}
    models = list(weights) + sorted(set(totals) - set(weights))
    return [_version_stats(model, weights.get(model), totals.get(model), latencies.get(model, []))
            for model in models]


def _version_stats(model: str, weight: int | None, total: tuple | None,
                   latencies: list[float]) -> dict[str, Any]:
    _, requests, errors, mean_ms, first_ms, prompt, completion, scored, mean_score = total or (
        model, 0, 0, None, None, 0, 0, 0, None)
    return {"model": model, "weight": weight, "requests": int(requests), "errors": int(errors or 0),
            "latency_ms": {"mean": _rounded(mean_ms), "p50": _percentile(latencies, 50),
                           "p95": _percentile(latencies, 95), "p99": _percentile(latencies, 99)},
            "first_token_ms_mean": _rounded(first_ms),
            "usage": {"prompt_tokens": int(prompt or 0), "completion_tokens": int(completion or 0)},
            "feedback": {"count": int(scored or 0), "mean": _rounded(mean_score, 4)}}


def _rounded(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(float(value), digits)


def _percentile(values: list[float], q: float) -> float | None:
    """The nearest-rank percentile."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return round(ordered[int(rank) - 1], 1)


def models_with_traffic(routes: Iterable[Route]) -> set[str]:
    return {v["model"] for route in routes for v in route.versions if v["weight"] > 0}


def prune(session: Session, retention_s: float, now: float | None = None) -> int:
    """Forget routed requests older than the retention (their stats go with them)."""
    return repo.prune_requests(session, int((time.time() if now is None else now) - retention_s))
