"""Tenants' named secrets (sealed values; services/tenancy/secrets.py seals and opens them)."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from tuneforge.db.repos import tenants as tenant_repo
from tuneforge.db.tables import TenantSecret
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
