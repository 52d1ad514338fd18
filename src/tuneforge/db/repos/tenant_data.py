"""Every row a tenant owns, read for its export and deleted when it is purged
(services/tenancy/deletion.py).

Kept when a tenant is deleted: its `tenants` row (a tombstone, `deleted_at` set), and the rows
billing is computed from — `metered_tokens`, and `jobs` with their `attempts` (GPU-hours are each
attempt's GPUs times its run time: services/tenancy/usage.py) — plus the audit log, which is
never deleted. Every other table with rows of the tenant is listed in `PURGED`, children first,
so that no foreign key is left pointing at a deleted row."""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, delete, func, select
from sqlalchemy.orm import Session

from tuneforge.db.tables import (
    ApiKey,
    Attempt,
    Base,
    Checkpoint,
    FileRow,
    FineTunedModel,
    Job,
    JobEvent,
    MeteredTokens,
    ModelStageChange,
    Route,
    RouteRequest,
    Sweep,
    SweepTrial,
    Tenant,
    TenantSecret,
    UploadPartRow,
    UploadRow,
    WebhookDelivery,
    WebhookEndpoint,
)

# never exported: hashes of credentials, sealed secrets, webhook signing secrets
SECRET_COLUMNS = {"api_keys": {"key_hash"}, "tenant_secrets": {"value"}, "webhook_endpoints": {"secret"},
                  "attempts": {"token_hash"}}
KEPT = ("tenants", "jobs", "attempts", "metered_tokens", "audit_log")


def _jobs_of(tenant_id: str) -> Any:
    return select(Job.job_id).where(Job.tenant_id == tenant_id).scalar_subquery()


def _owned(model: Any, tenant_id: str) -> ColumnElement[bool]:
    if model in (JobEvent, Checkpoint):
        return model.job_id.in_(_jobs_of(tenant_id))
    if model is SweepTrial:
        return model.sweep_id.in_(select(Sweep.sweep_id).where(Sweep.tenant_id == tenant_id).scalar_subquery())
    return model.tenant_id == tenant_id


# children before their parents
PURGED: tuple[type[Base], ...] = (RouteRequest, Route, WebhookDelivery, WebhookEndpoint, ModelStageChange,
                                  FineTunedModel, SweepTrial, Sweep, JobEvent, Checkpoint, UploadPartRow,
                                  UploadRow, FileRow, TenantSecret, ApiKey)
EXPORTED: tuple[type[Base], ...] = (*PURGED, Job, Attempt, MeteredTokens)


def _plain(value: Any) -> Any:
    to_json = getattr(value, "to_json", None)
    return to_json() if callable(to_json) else value


def export_rows(session: Session, tenant_id: str) -> dict[str, list[dict[str, Any]]]:
    """Every row of the tenant in each table of `EXPORTED`, as plain values, credentials left out."""
    exported: dict[str, list[dict[str, Any]]] = {}
    for model in EXPORTED:
        table = model.__table__
        hidden = SECRET_COLUMNS.get(table.name, set())
        where = Attempt.job_id.in_(_jobs_of(tenant_id)) if model is Attempt else _owned(model, tenant_id)
        rows = session.execute(select(table).where(where).order_by(table.c.pk)).mappings()
        exported[table.name] = [{k: _plain(v) for k, v in row.items() if k not in hidden} for row in rows]
    return exported


def purge_rows(session: Session, tenant_id: str) -> dict[str, int]:
    """Delete the tenant's rows of every table in `PURGED`: how many each lost."""
    counts: dict[str, int] = {}
    for model in PURGED:
        result = session.execute(delete(model).where(_owned(model, tenant_id)).execution_options(
            synchronize_session=False))
        counts[model.__table__.name] = int(getattr(result, "rowcount", 0) or 0)
    return counts


def remaining(session: Session, tenant_id: str) -> dict[str, int]:
    """Rows of the tenant left in each table of `PURGED` (all zero once purged)."""
    return {model.__table__.name: int(session.scalar(select(func.count()).select_from(model)
                                                     .where(_owned(model, tenant_id))) or 0)
            for model in PURGED}


def active_attempts(session: Session, tenant_id: str, active_statuses: list[str]) -> int:
    return int(session.scalar(select(func.count()).select_from(Attempt).where(
        Attempt.job_id.in_(_jobs_of(tenant_id)), Attempt.status.in_(active_statuses))) or 0)


def unfinished_jobs(session: Session, tenant_id: str, terminal_statuses: list[str]) -> list[Job]:
    return list(session.scalars(select(Job).where(Job.tenant_id == tenant_id, Job.status.not_in(terminal_statuses))
                                .order_by(Job.pk)))


def pending_deletions(session: Session) -> list[str]:
    """Ids of tenants deleted but not yet purged (a trainer of theirs was still stopping)."""
    return list(session.scalars(select(Tenant.tenant_id).where(Tenant.deleted_at.is_not(None),
                                                                Tenant.purged_at.is_(None))))
