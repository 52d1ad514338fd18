"""Who is calling: an API key checked against the database, and the keys this process trusts a moment.

`authenticate` reads the key's row and its tenant (unknown, revoked and expired
keys all get one answer); `KeyCache` keeps what it verified for `ttl_s`, so a
busy key costs a hash and a dict lookup. Issuing and revoking keys is
`services/tenancy/tenants.py`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import NamedTuple

from sqlalchemy.orm import Session, make_transient_to_detached

from tuneforge.db.repos import tenants as tenant_repo
from tuneforge.db.tables import ApiKey, Tenant
from tuneforge.domain.errors import ApiError, unauthorized

# last_used_at is written only when the stored value is at least this old: a busy key costs one
# write a minute, not one per request
LAST_USED_RESOLUTION_S = 60


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
