"""Tenants' named secrets (sealed values; services/tenancy/secrets.py seals and opens them)."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from tuneforge.db.repos import tenants as tenant_repo
from tuneforge.db.tables import TenantDataKey, TenantSecret
from tuneforge.db.tenancy import owned


def get(session: Session, tenant_id: str, name: str) -> TenantSecret | None:
    return session.scalar(owned(TenantSecret, tenant_id).where(TenantSecret.name == name))


def of_tenant(session: Session, tenant_id: str) -> list[TenantSecret]:
    return list(session.scalars(owned(TenantSecret, tenant_id).order_by(TenantSecret.name)))


def named(session: Session, tenant_id: str, names: set[str]) -> list[TenantSecret]:
    if not names:
        return []
    return list(session.scalars(owned(TenantSecret, tenant_id).where(TenantSecret.name.in_(sorted(names)))))


def count_locked(session: Session, tenant_id: str) -> int:
    """How many secrets the tenant has, with its tenant row locked until the transaction ends, so
    two requests at once cannot both pass a limit on the count."""
    tenant_repo.lock(session, tenant_id)
    return int(session.scalar(select(func.count()).select_from(TenantSecret)
                              .where(TenantSecret.tenant_id == tenant_id)) or 0)


def all_rows(session: Session) -> list[TenantSecret]:
    """Every tenant's secrets (key rotation only)."""
    return list(session.scalars(select(TenantSecret).order_by(TenantSecret.pk)))


def data_keys(session: Session) -> list[TenantDataKey]:
    """Every tenant's live data key (key rotation only)."""
    return list(session.scalars(select(TenantDataKey).where(TenantDataKey.sealed.is_not(None))
                                .order_by(TenantDataKey.pk)))


def newest_data_key(session: Session, tenant_id: str) -> TenantDataKey | None:
    return session.scalar(select(TenantDataKey).where(TenantDataKey.tenant_id == tenant_id)
                          .order_by(TenantDataKey.pk.desc()).limit(1))


def data_key(session: Session, key_id: str) -> TenantDataKey | None:
    return session.scalar(select(TenantDataKey).where(TenantDataKey.key_id == key_id))


def live_data_keys(session: Session, tenant_id: str) -> list[TenantDataKey]:
    return list(session.scalars(select(TenantDataKey).where(TenantDataKey.tenant_id == tenant_id,
                                                            TenantDataKey.revoked_at.is_(None))))
