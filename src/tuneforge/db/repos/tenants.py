from __future__ import annotations

import hashlib
import time

from sqlalchemy import select
from sqlalchemy.orm import Session

from tuneforge.db.engine import write_lock
from tuneforge.db.tables import ApiKey, Tenant
from tuneforge.db.tenancy import owned


def hash_key(api_key: str) -> str:
    # API keys are 192-bit random secrets, so a plain SHA-256 is enough to make
    # a leaked table useless; no salt or slow hash is needed for such entropy.
    return hashlib.sha256(api_key.encode()).hexdigest()


def by_name(session: Session, name: str) -> Tenant | None:
    return session.scalar(select(Tenant).where(Tenant.name == name))


def by_id(session: Session, tenant_id: str) -> Tenant | None:
    return session.scalar(select(Tenant).where(Tenant.tenant_id == tenant_id))


def is_deleted(session: Session, tenant_id: str) -> bool:
    """Whether the tenant has been deleted (its row is a tombstone: services/tenancy/deletion.py)."""
    return session.scalar(select(Tenant.deleted_at).where(Tenant.tenant_id == tenant_id)) is not None


def tier_of(session: Session, tenant_id: str) -> str | None:
    """The tenant's tier; None when there is no such tenant."""
    return session.scalar(select(Tenant.tier).where(Tenant.tenant_id == tenant_id))


def tiers(session: Session) -> dict[str, str]:
    """tenant_id -> tier of every tenant (platform-wide on purpose: the scheduler orders every
    tenant's jobs by tier)."""
    return dict(session.execute(select(Tenant.tenant_id, Tenant.tier)).all())


def by_api_key(session: Session, api_key: str, now: float | None = None) -> Tenant | None:
    """The tenant whose key `api_key` is, if that key is neither revoked nor expired at `now`."""
    found = key_and_tenant(session, api_key)
    if found is None or not usable(found[0], time.time() if now is None else now):
        return None
    return found[1]


def key_and_tenant(session: Session, api_key: str) -> tuple[ApiKey, Tenant] | None:
    """The stored key whose hash matches, and its tenant, whatever the key's state."""
    row = session.execute(
        select(ApiKey, Tenant)
        .join(Tenant, ApiKey.tenant_id == Tenant.tenant_id)
        .where(ApiKey.key_hash == hash_key(api_key))
    ).first()
    return None if row is None else (row[0], row[1])


def lock(session: Session, tenant_id: str) -> Tenant | None:
    """The tenant's row, read afresh and locked until the transaction ends: requests of the tenant
    that check a limit and then write wait for each other (PostgreSQL: a row lock; SQLite: the
    database's write lock, `write_lock`)."""
    write_lock(session)
    return session.scalar(select(Tenant).where(Tenant.tenant_id == tenant_id).with_for_update()
                          .execution_options(populate_existing=True))


def usable(key: ApiKey, now: float) -> bool:
    return key.revoked_at is None and (key.expires_at is None or now < key.expires_at)


def keys_of(session: Session, tenant_id: str) -> list[ApiKey]:
    return list(session.scalars(owned(ApiKey, tenant_id).order_by(ApiKey.pk)))


def key_of(session: Session, tenant_id: str, key_id: str) -> ApiKey | None:
    return session.scalar(owned(ApiKey, tenant_id).where(ApiKey.key_id == key_id))


def list_all(session: Session) -> list[Tenant]:
    return list(session.scalars(select(Tenant).order_by(Tenant.pk)))
