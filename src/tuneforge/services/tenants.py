"""Tenants and their API keys."""

from __future__ import annotations

import re
import secrets
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

from sqlalchemy.orm import Session, make_transient_to_detached

from tuneforge.db.repos import tenants as tenant_repo
from tuneforge.db.tables import ApiKey, Tenant
from tuneforge.domain.errors import ApiError, conflict, invalid, not_found, unauthorized
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
    _key, api_key = issue_key(session, tenant)
    return tenant, api_key


KEY_NAME_MAX = 128
# An expiry further away than this is a typo, not a policy; a key that should never expire sets none.
KEY_MAX_LIFETIME_S = 10 * 366 * 86400
# last_used_at is written only when the stored value is at least this old: a busy key costs one
# write a minute, not one per request
LAST_USED_RESOLUTION_S = 60


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


def _presented_key(authorization: str | None) -> str:
    if not authorization:
        raise unauthorized(
            "You didn't provide an API key. Send it as 'Authorization: Bearer YOUR_KEY'.",
            code="missing_api_key",
        )
    scheme, _, api_key = authorization.partition(" ")
    if scheme.lower() != "bearer" or not api_key.strip():
        raise unauthorized("Authorization header must be 'Bearer YOUR_KEY'.")
    return api_key.strip()


def authenticate(session: Session, authorization: str | None, now: float | None = None) -> Tenant:
    return _authenticated_key(session, authorization, now)[1]


def _authenticated_key(session: Session, authorization: str | None,
                       now: float | None = None) -> tuple[ApiKey, Tenant]:
    api_key = _presented_key(authorization)
    now = time.time() if now is None else now
    found = tenant_repo.key_and_tenant(session, api_key)
    # unknown, revoked and expired keys get the same answer: it says nothing of which it was
    if found is None or not tenant_repo.usable(found[0], now):
        raise unauthorized("Incorrect API key provided.")
    key, tenant = found
    if key.last_used_at is None or now - key.last_used_at >= LAST_USED_RESOLUTION_S:
        key.last_used_at = int(now)
    return key, tenant


_TENANT_COLUMNS = tuple(column.key for column in Tenant.__table__.columns)
_TENANT_ID = _TENANT_COLUMNS.index("tenant_id")
_TIER = _TENANT_COLUMNS.index("tier")


class Caller(NamedTuple):
    """Who is calling, as the lean routes need it."""
    tenant_id: str
    tier: str


@dataclass(frozen=True)
class _Verified:
    """A key as the database showed it at `checked_at`, with its tenant's columns."""
    tenant: tuple
    expires_at: int | None
    checked_at: float


class KeyCache:
    """The API keys this process has verified, each trusted for at most `ttl_s`.

    A hit costs a SHA-256 and a dict lookup instead of a database round trip. After `ttl_s` the
    key is looked up again, so a revoked key, a changed tier or new quota overrides take effect
    within `ttl_s` in every API process; a key's expiry is checked on every request. From
    `refresh_after_s` on, a hit is still trusted but says that a look-up is due, which the API
    runs in the background (api/keys.KeyLookups): a busy key is re-read before its entry
    expires, and its requests never all miss at once. Only keys that authenticated are kept (an
    unknown key is looked up each time), at most `max_keys`."""

    def __init__(self, ttl_s: float = 1.0, max_keys: int = 10_000, refresh_after_s: float | None = None) -> None:
        self.ttl_s = ttl_s
        self.refresh_after_s = ttl_s * 0.75 if refresh_after_s is None else refresh_after_s
        self.max_keys = max_keys
        self._entries: dict[str, _Verified] = {}
        # bumped by forget(): a look-up that read the database before a change must not store
        # what it read after the change emptied the cache
        self._generation = 0

    def tenant(self, authorization: str | None, now: float | None = None) -> Tenant | None:
        """The caller's tenant from the cache, or None when the database must be asked.
        Raises 401 for a missing or malformed header and for a cached key that has expired."""
        values = self.peek(authorization, now)[1]
        return None if values is None else tenant_of(values)

    def caller(self, authorization: str | None, now: float | None = None) -> Caller | None:
        """`tenant`, as the tenant's id and tier only: what the lean routes need, without the cost
        of a Tenant object."""
        values = self.peek(authorization, now)[1]
        return None if values is None else caller_of(values)

    def peek(self, authorization: str | None, now: float | None = None) -> tuple[str, tuple | None, bool]:
        """(the key's hash, its tenant's columns or None when the database must be asked, whether a
        look-up is due). Raises 401 for a missing or malformed header and for a cached key that
        has expired."""
        key_hash = tenant_repo.hash_key(_presented_key(authorization))
        entry = self._entries.get(key_hash)
        now = time.time() if now is None else now
        if entry is None:
            return key_hash, None, True
        age_s = now - entry.checked_at
        if not 0 <= age_s < self.ttl_s:
            return key_hash, None, True
        if entry.expires_at is not None and now >= entry.expires_at:
            raise unauthorized("Incorrect API key provided.")
        return key_hash, entry.tenant, age_s >= self.refresh_after_s

    def verify(self, session: Session, authorization: str | None, now: float | None = None) -> Tenant:
        """`authenticate` against the database, remembering the answer."""
        return tenant_of(self.verify_columns(session, authorization, now))

    def verify_columns(self, session: Session, authorization: str | None, now: float | None = None) -> tuple:
        """`verify`, answering the tenant's columns (see `tenant_of`, `caller_of`). A key the
        database refuses is dropped from the cache at once."""
        now = time.time() if now is None else now
        generation = self._generation
        key_hash = tenant_repo.hash_key(_presented_key(authorization))  # a malformed header: 401 here
        try:
            key, tenant = _authenticated_key(session, authorization, now)
        except ApiError:
            self._entries.pop(key_hash, None)
            raise
        if len(self._entries) >= self.max_keys:
            self._entries.clear()  # a crude bound: the next requests are looked up again
        entry = _Verified(tuple(getattr(tenant, name) for name in _TENANT_COLUMNS), key.expires_at, now)
        if generation == self._generation:
            self._entries[key.key_hash] = entry
        return entry.tenant

    def forget(self) -> None:
        self._generation += 1
        self._entries.clear()


def caller_of(values: tuple) -> Caller:
    """The Caller of a key's cached columns."""
    return Caller(values[_TENANT_ID], values[_TIER])


def tenant_of(values: tuple) -> Tenant:
    """The Tenant of a key's cached columns: a fresh one per request (never shared between
    requests), known to be a stored row."""
    tenant = Tenant(**dict(zip(_TENANT_COLUMNS, values)))
    make_transient_to_detached(tenant)
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
