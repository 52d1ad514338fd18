"""Tenants and their API keys."""

from __future__ import annotations

import re
import secrets
import time
from typing import Any

from sqlalchemy.orm import Session

from tuneforge.db.repos import tenants as tenant_repo
from tuneforge.db.tables import ApiKey, Tenant
from tuneforge.domain.errors import ApiError, conflict, invalid, not_found
from tuneforge.domain.ids import new_id
from tuneforge.domain.vocab import TIERS
from tuneforge.services.tenancy import quotas, usage

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
    _key, api_key = issue_key(session, tenant)
    return tenant, api_key


KEY_NAME_MAX = 128
# An expiry further away than this is a typo, not a policy; a key that should never expire sets none.
KEY_MAX_LIFETIME_S = 10 * 366 * 86400


def issue_key(session: Session, tenant: Tenant, *, name: str | None = None, expires_at: int | None = None,
              now: float | None = None) -> tuple[ApiKey, str]:
    """A new key of `tenant`: its row (public fields only) and the secret, returned once and never stored."""
    api_key = KEY_PREFIX + secrets.token_urlsafe(32)
    row = ApiKey(
        key_id=new_id("key"),
        tenant_id=tenant.tenant_id,
        key_hash=tenant_repo.hash_key(api_key),
        key_prefix=api_key[:10],
        name=name,
        created_at=int(time.time() if now is None else now),
        expires_at=expires_at,
    )
    session.add(row)
    session.flush()
    return row, api_key


def _checked_name(name: str | None) -> str | None:
    if name is None:
        return None
    name = name.strip()
    if len(name) > KEY_NAME_MAX or any(not ch.isprintable() for ch in name):
        raise invalid(f"a key's name must be at most {KEY_NAME_MAX} printable characters", param="name")
    return name or None


def _expiry(now: float, expires_in_s: int | None, expires_at: int | None) -> int | None:
    if expires_in_s is not None and expires_at is not None:
        raise invalid("give expires_in_s or expires_at, not both", param="expires_in_s")
    if expires_in_s is not None:
        if not 0 < expires_in_s <= KEY_MAX_LIFETIME_S:
            raise invalid(f"expires_in_s must be between 1 and {KEY_MAX_LIFETIME_S}", param="expires_in_s")
        return int(now) + expires_in_s
    if expires_at is not None:
        if not now < expires_at <= now + KEY_MAX_LIFETIME_S:
            raise invalid("expires_at must be a future unix time at most ten years away", param="expires_at")
        return expires_at
    return None


def create_key(session: Session, tenant_name: str, *, name: str | None = None, expires_in_s: int | None = None,
               expires_at: int | None = None, now: float | None = None) -> tuple[ApiKey, str]:
    """Another key of the tenant named `tenant_name`, optionally labelled and expiring."""
    now = time.time() if now is None else now
    label = _checked_name(name)
    expiry = _expiry(now, expires_in_s, expires_at)
    return issue_key(session, _named(session, tenant_name), name=label, expires_at=expiry, now=now)


def list_keys(session: Session, tenant_name: str) -> list[ApiKey]:
    """Every key of the tenant, revoked and expired ones too, oldest first."""
    return tenant_repo.keys_of(session, _named(session, tenant_name).tenant_id)


def revoke_key(session: Session, tenant_name: str, key_id: str, now: float | None = None) -> ApiKey:
    """Revoke one of the tenant's keys; the next request with it is refused. Revoking a revoked key
    changes nothing. Another tenant's key is not found."""
    tenant = _named(session, tenant_name)
    key = tenant_repo.key_of(session, tenant.tenant_id, key_id)
    if key is None:
        raise not_found(f"no API key {key_id!r} for tenant {tenant_name!r}", param="key_id")
    if key.revoked_at is None:
        key.revoked_at = int(time.time() if now is None else now)
        session.flush()
    return key


def key_view(key: ApiKey, now: float | None = None) -> dict[str, Any]:
    """What may be shown of a key: never the secret, never its hash."""
    now = time.time() if now is None else now
    return {"object": "api_key", "id": key.key_id, "prefix": key.key_prefix, "name": key.name,
            "created_at": key.created_at, "last_used_at": key.last_used_at, "expires_at": key.expires_at,
            "revoked_at": key.revoked_at, "active": tenant_repo.usable(key, now)}


def list_tenants(session: Session) -> list[Tenant]:
    return tenant_repo.list_all(session)


def tenant_named(session: Session, name: str) -> Tenant:
    """The tenant called `name`; 404 when there is none."""
    return _named(session, name)


def tenant_id_of(session: Session, name_or_id: str | None) -> str | None:
    """The id of the tenant named `name_or_id`, else `name_or_id` itself (an id, perhaps of a
    tenant since deleted); None stays None."""
    if name_or_id is None:
        return None
    named = tenant_repo.by_name(session, name_or_id)
    return name_or_id if named is None else named.tenant_id


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
    """Override some of the tenant's quotas (services/tenancy/quotas.py): a limit >= 0, `quotas.UNLIMITED`,
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
