"""/v1/admin — tenants, their API keys, tiers, quotas, usage across tenants and the whole queue, for operators.

Authenticated by `TUNEFORGE_ADMIN_API_KEY` (Bearer); without one configured the
admin API is off and answers 404, so a default install exposes nothing.
The same operations exist in the CLI (`tuneforge tenants ...`, `usage`, `queue`).
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Depends, Header, Path, Query
from pydantic import BaseModel, ConfigDict, Field

from tuneforge.api import deps
from tuneforge.api.credentials import admin_refusal
from tuneforge.api.limits import MAX_NAME_CHARS, MONTH_PATTERN
from tuneforge.api.objects import fine_tuned_model_object
from tuneforge.api.openapi import error_responses
from tuneforge.api.schemas.admin import (
    AdminUsage,
    ApiKey,
    ApiKeyList,
    AuditList,
    PoolReclaim,
    Queue,
    Tenant,
    TenantDeletion,
    TenantList,
)
from tuneforge.api.schemas.base import ObjectRoute
from tuneforge.api.schemas.models import Model
from tuneforge.db import Session
from tuneforge.db.repos import attempts as attempt_repo
from tuneforge.domain.errors import not_found
from tuneforge.registry import models as registry
from tuneforge.serve.vllm import serving_changed
from tuneforge.services.context import Platform
from tuneforge.services.tenancy import audit as audit_service
from tuneforge.services.tenancy import deletion as deletion_service
from tuneforge.services.tenancy import quotas, usage
from tuneforge.services.tenancy import tenants as tenant_service
from tuneforge.services.training import queue as queue_service

router = APIRouter(prefix="/v1/admin", tags=["admin"], route_class=ObjectRoute)

Limit = Annotated[float, Field(ge=0, le=1e12)] | Literal["unlimited", "default"] | None


def admin(authorization: str | None = Header(default=None), platform: Platform = Depends(deps.platform)) -> None:
    refusal = admin_refusal(platform.settings, authorization)  # the same rule the edge applies before the body
    if refusal is not None:
        raise refusal


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class TenantCreate(_Strict):
    name: str = Field(max_length=MAX_NAME_CHARS)
    tier: str = Field("standard", max_length=MAX_NAME_CHARS)


class TierChange(_Strict):
    tier: str = Field(max_length=MAX_NAME_CHARS)


class QuotaChange(_Strict):
    max_concurrent_jobs: Limit = Field(None, description="a number, 'unlimited' or 'default'; absent: unchanged")
    max_queued_jobs: Limit = None
    gpu_hours_hard: Limit = None
    gpu_hours_soft: Limit = None


def _tenant_object(tenant: Any) -> dict[str, Any]:
    limits = quotas.limits(tenant)
    return {"object": "tenant", "id": tenant.tenant_id, "name": tenant.name, "tier": tenant.tier,
            "pii_policy": tenant.pii_policy, "created_at": tenant.created_at, "deleted_at": tenant.deleted_at,
            "quotas": {name: getattr(limits, name) for name in quotas.QUOTA_FIELDS}}


@router.post("/tenants", dependencies=[Depends(admin)], response_model=Tenant, responses=error_responses(409))
def create_tenant(body: TenantCreate, session: Session = deps.SESSION) -> dict:
    """The tenant and its first API key (shown once)."""
    tenant, api_key = tenant_service.create_tenant(session, body.name, body.tier)
    return {**_tenant_object(tenant), "api_key": api_key}


@router.get("/tenants", dependencies=[Depends(admin)], response_model=TenantList)
def list_tenants(session: Session = deps.SESSION) -> dict:
    return {"object": "list", "has_more": False,
            "data": [_tenant_object(t) for t in tenant_service.list_tenants(session)]}


@router.delete("/tenants/{name}", dependencies=[Depends(admin)], response_model=TenantDeletion,
               responses=error_responses(404))
def delete_tenant(name: str = Path(..., min_length=1, max_length=64), session: Session = deps.SESSION,
                  platform: Platform = Depends(deps.platform)) -> dict:
    """Export the tenant's data to the object store, cancel its jobs, revoke its keys, then delete
    every object under its prefix and every row of it but billing and the audit log. Idempotent."""
    deletion = deletion_service.delete_tenant(session, platform.store, name)
    _stored(session, platform)
    return deletion.view()


class KeyCreate(_Strict):
    name: str | None = Field(None, max_length=tenant_service.KEY_NAME_MAX, description="A label for the key.")
    expires_in_s: int | None = Field(None, gt=0, le=tenant_service.KEY_MAX_LIFETIME_S,
                                     description="Seconds until the key stops working; absent: it does not expire.")
    expires_at: int | None = Field(None, gt=0, le=2**40,
                                   description="Unix time the key stops working (instead of expires_in_s).")


TenantName = Path(..., min_length=1, max_length=64)
KeyId = Path(..., min_length=1, max_length=64)


@router.post("/tenants/{name}/keys", dependencies=[Depends(admin)], response_model=ApiKey)
def create_key(name: str = TenantName, body: KeyCreate | None = Body(default=None),
               session: Session = deps.SESSION) -> dict:
    """Another API key of the tenant; the secret is in `api_key`, shown this once."""
    body = body or KeyCreate()
    key, api_key = tenant_service.create_key(session, name, name=body.name, expires_in_s=body.expires_in_s,
                                             expires_at=body.expires_at)
    return {**tenant_service.key_view(key), "api_key": api_key}


@router.get("/tenants/{name}/keys", dependencies=[Depends(admin)], response_model=ApiKeyList)
def list_keys(name: str = TenantName, session: Session = deps.SESSION) -> dict:
    """The tenant's keys, revoked and expired ones too; never a secret."""
    keys = tenant_service.list_keys(session, name)
    return {"object": "list", "has_more": False, "data": [tenant_service.key_view(key) for key in keys]}


@router.delete("/tenants/{name}/keys/{key_id}", dependencies=[Depends(admin)], response_model=ApiKey)
def revoke_key(name: str = TenantName, key_id: str = KeyId, session: Session = deps.SESSION,
               platform: Platform = Depends(deps.platform)) -> dict:
    """Revoke the key: the next request with it answers 401 (in every API process within a second)."""
    key = tenant_service.revoke_key(session, name, key_id)
    _stored(session, platform)
    return tenant_service.key_view(key)


def _stored(session: Session, platform: Platform) -> None:
    """Commit a change to a tenant or its keys, then drop this process's verified keys, so that
    the change applies to the very next request here (other processes re-check within
    `KeyCache.ttl_s`). In this order: a request between the two cannot cache the old state."""
    session.commit()
    platform.keys.forget()


@router.post("/tenants/{name}/tier", dependencies=[Depends(admin)], response_model=Tenant)
def set_tier(name: str, body: TierChange, session: Session = deps.SESSION,
             platform: Platform = Depends(deps.platform)) -> dict:
    tenant = tenant_service.set_tier(session, name, body.tier)
    _stored(session, platform)
    return _tenant_object(tenant)


@router.post("/tenants/{name}/quota", dependencies=[Depends(admin)], response_model=Tenant)
def set_quota(name: str, body: QuotaChange, session: Session = deps.SESSION,
              platform: Platform = Depends(deps.platform)) -> dict:
    changes: dict[str, float | None] = {}
    for field in body.model_fields_set:
        value = getattr(body, field)
        changes[field] = quotas.UNLIMITED if value == "unlimited" else None if value == "default" else value
    tenant = tenant_service.set_quota(session, name, changes)
    _stored(session, platform)
    return _tenant_object(tenant)


@router.get("/usage", dependencies=[Depends(admin)], response_model=AdminUsage)
def usage_all(month: str | None = Query(default=None, pattern=MONTH_PATTERN, description="YYYY-MM (UTC); default "
                                                                                      "this month."),
              session: Session = deps.SESSION) -> dict:
    now = time.time()
    chosen = usage.parse_month(month) if month is not None else usage.current_month(now)
    return {"object": "list", "month": chosen, "data": tenant_service.usage_report(session, chosen, now)}


@router.get("/queue", dependencies=[Depends(admin)], response_model=Queue)
def whole_queue(session: Session = deps.SESSION, platform: Platform = Depends(deps.platform)) -> dict:
    entries = queue_service.whole_queue(session, platform)
    return {"object": "list", "data": [
        {"position": e.position, "job_id": e.job_id, "tenant_id": e.tenant_id, "tier": e.tier, "gpus": e.gpus,
         "queued_at": int(e.queued_at),
         "estimated_start": None if e.estimated_start is None else int(e.estimated_start)} for e in entries]}


class Reclaim(_Strict):
    nodes: list[Annotated[str, Field(max_length=256)]] | None = Field(
        None, max_length=1024, description="Only attempts on these nodes (the nodes being reclaimed); default: "
                                           "the whole pool.")


@router.post("/pools/{pool}/reclaim", dependencies=[Depends(admin)], response_model=PoolReclaim,
              responses=error_responses(404))
def reclaim_pool(pool: str, body: Reclaim | None = Body(default=None), session: Session = deps.SESSION,
                 platform: Platform = Depends(deps.platform)) -> dict:
    """A reclaim notice for spot capacity (the provider's interruption notice, or a drained node),
    forwarded by whatever watches for it: every attempt running there checkpoints and stops, and
    its job resumes elsewhere. The scheduler sends the signal on its next tick."""
    if pool not in platform.settings.capacity_pools:
        raise not_found(f"no capacity pool named {pool!r}", param="pool", code="pool_not_found")
    nodes = set(body.nodes) if body and body.nodes else None
    marked = []
    for attempt in attempt_repo.active(session):
        placement = attempt.placement or {}
        if placement.get("pool") != pool or (nodes is not None and not nodes & set(placement.get("spans") or {})):
            continue
        if not (attempt.handle or {}).get("reclaim_requested"):
            attempt.handle = {**(attempt.handle or {}), "reclaim_requested": time.time()}
        marked.append({"job_id": attempt.job_id, "attempt": attempt.number})
    return {"object": "pool.reclaim", "pool": pool, "attempts": marked}


class AdminPromote(_Strict):
    stage: Literal["dev", "staging", "production", "archived"]
    reason: str | None = Field(None, max_length=2000, description="Required when the model's gates failed.")
    override: bool = Field(False, description="Promote a model whose eval gates failed (recorded with the reason).")


@router.post("/models/{model_id:path}/promote", dependencies=[Depends(admin)], response_model=Model,
              responses=error_responses(409))
def promote_model(model_id: str, body: AdminPromote, session: Session = deps.SESSION,
                  platform: Platform = Depends(deps.platform)) -> dict:
    """Any tenant's model; with `override` past failed gates — audited in the model's stage history."""
    row = registry.get_any(session, model_id)
    registry.promote(session, row, body.stage, actor="admin", override=body.override, reason=body.reason)
    session.commit()  # stored before the vLLM servers are brought in line
    serving_changed(platform, session)
    return fine_tuned_model_object(row)


@router.get("/audit", dependencies=[Depends(admin)], response_model=AuditList)
def audit_log(tenant: str | None = Query(default=None, max_length=64, description="A tenant's name or id."),
              resource_id: str | None = Query(default=None, max_length=256),
              action: str | None = Query(default=None, max_length=128),
              after: int | None = Query(default=None, ge=0, le=2**62, description="The last `id` seen."),
              limit: int = Query(default=100, ge=1, le=100),
              session: Session = deps.SESSION) -> dict:
    """The audit log, oldest first: every change to a tenant's resources or the platform, with who
    made it (a tenant's key, `admin` or `platform`), its request id and outcome."""
    rows, has_more = audit_service.entries(session, tenant_id=tenant_service.tenant_id_of(session, tenant),
                                           resource_id=resource_id, action=action, after=after, limit=limit)
    return {"object": "list", "has_more": has_more, "last_id": rows[-1].pk if rows else None,
            "data": [audit_service.view(row) for row in rows]}
