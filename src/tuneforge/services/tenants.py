"""Tenants and their API keys."""

from __future__ import annotations

import re
import secrets
import time
from typing import Any

from sqlalchemy.orm import Session

from tuneforge.db.repos import tenants as tenant_repo
from tuneforge.db.tables import ApiKey, Tenant
from tuneforge.domain.errors import ApiError, conflict, invalid, unauthorized
from tuneforge.domain.ids import new_id
from tuneforge.services import quotas, usage

TIERS = ("free", "standard", "premium")
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
KEY_PREFIX = "tf-"


def create_tenant(session: Session, name: str, tier: str = "standard") -> tuple[Tenant, str]:
    """Create a tenant and its first API key; the key is returned once, never stored."""
    if not _NAME.match(name):
        raise invalid(
            "tenant name must be 1-64 characters of a-z, 0-9, '-' or '_', starting with a letter or digit",
            param="name",
        )
    if tier not in TIERS:
        raise invalid(f"tier must be one of {', '.join(TIERS)}", param="tier")
    if tenant_repo.by_name(session, name) is not None:
        raise conflict(f"tenant {name!r} already exists", param="name", code="tenant_exists")
    tenant = Tenant(tenant_id=new_id("tenant", 16), name=name, tier=tier, created_at=int(time.time()))
    session.add(tenant)
    session.flush()
    return tenant, issue_key(session, tenant)


def issue_key(session: Session, tenant: Tenant) -> str:
    api_key = KEY_PREFIX + secrets.token_urlsafe(32)
    session.add(
        ApiKey(
            tenant_id=tenant.tenant_id,
            key_hash=tenant_repo.hash_key(api_key),
            key_prefix=api_key[:10],
            created_at=int(time.time()),
        )
    )
    return api_key


def authenticate(session: Session, authorization: str | None) -> Tenant:
    if not authorization:
        raise unauthorized(
            "You didn't provide an API key. Send it as 'Authorization: Bearer YOUR_KEY'.",
            code="missing_api_key",
        )
    scheme, _, api_key = authorization.partition(" ")
    if scheme.lower() != "bearer" or not api_key.strip():
        raise unauthorized("Authorization header must be 'Bearer YOUR_KEY'.")
    tenant = tenant_repo.by_api_key(session, api_key.strip())
    if tenant is None:
        raise unauthorized("Incorrect API key provided.")
    return tenant


def list_tenants(session: Session) -> list[Tenant]:
    return tenant_repo.list_all(session)


def _named(session: Session, name: str) -> Tenant:
    tenant = tenant_repo.by_name(session, name)
    if tenant is None:
        raise ApiError(404, f"no tenant named {name!r}", param="name", code="not_found")
    return tenant


def set_tier(session: Session, name: str, tier: str) -> Tenant:
    if tier not in TIERS:
        raise invalid(f"tier must be one of {', '.join(TIERS)}", param="tier")
    tenant = _named(session, name)
    tenant.tier = tier
    return tenant


PII_POLICIES = ("warn", "redact", "reject")


def set_pii_policy(session: Session, name: str, policy: str) -> Tenant:
    """The tenant's default for personal data and secrets in training data (a job may override it)."""
    if policy not in PII_POLICIES:
        raise invalid(f"PII policy must be one of {', '.join(PII_POLICIES)}", param="policy")
    tenant = _named(session, name)
    tenant.pii_policy = policy
    return tenant


def set_quota(session: Session, name: str, changes: dict[str, float | None]) -> Tenant:
    """Override some of the tenant's quotas (services/quotas.py): a limit >= 0, `quotas.UNLIMITED`,
    or None to go back to the tier's default. Quotas not named keep their value."""
    tenant = _named(session, name)
    checked = {field: quotas.checked_override(field, value) for field, value in changes.items()}
    for field, value in checked.items():  # all checked first: a bad value changes nothing
        setattr(tenant, field, value)
    return tenant


def usage_report(session: Session, month: str, now: float) -> list[dict[str, Any]]:
    """Every tenant's GPU-hours in `month` against its allowance and cap (admin view), by tenant creation."""
    start, end = usage.month_bounds(month)
    by_tenant = usage.usage_by_tenant(session, start, end, now)
    return [
        {"tenant": tenant.name, "tier": tenant.tier,
         **quotas.totals(tenant, month, by_tenant.get(tenant.tenant_id, usage.Metered()))}
        for tenant in tenant_repo.list_all(session)
    ]
