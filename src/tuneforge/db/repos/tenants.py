from __future__ import annotations

import hashlib

from sqlalchemy import select
from sqlalchemy.orm import Session

from tuneforge.db.tables import ApiKey, Tenant


def hash_key(api_key: str) -> str:
    # API keys are 192-bit random secrets, so a plain SHA-256 is enough to make
    # a leaked table useless; no salt or slow hash is needed for such entropy.
    return hashlib.sha256(api_key.encode()).hexdigest()


def by_name(session: Session, name: str) -> Tenant | None:
    return session.scalar(select(Tenant).where(Tenant.name == name))


def by_id(session: Session, tenant_id: str) -> Tenant | None:
    return session.scalar(select(Tenant).where(Tenant.tenant_id == tenant_id))


def by_api_key(session: Session, api_key: str) -> Tenant | None:
    return session.scalar(
        select(Tenant)
        .join(ApiKey, ApiKey.tenant_id == Tenant.tenant_id)
        .where(ApiKey.key_hash == hash_key(api_key), ApiKey.revoked_at.is_(None))
    )


def list_all(session: Session) -> list[Tenant]:
    return list(session.scalars(select(Tenant).order_by(Tenant.pk)))
