"""The audit trail: who changed what, when, under which request.

Requests are recorded by the API's edge (api/audit.py) once they are answered, through `record_request`;
state changes no request makes (a job's transitions by the scheduler and the trainers' reports) are
recorded where they happen with the actor `platform` (services/training/transitions.py). Rows are
appended only: the repository has no update or delete, and tenant deletion keeps them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from tuneforge.db.repos import audit as audit_repo
from tuneforge.db.repos import models as model_repo
from tuneforge.db.repos import tenants as tenant_repo
from tuneforge.db.repos.audit import Entry
from tuneforge.db.tables import AuditRecord

__all__ = ["Entry", "record", "platform_change", "record_request", "entries", "view", "operator_command"]

PLATFORM = "platform"
ADMIN = "admin"
TENANT = "tenant"


def record(session: Session, entry: Entry) -> AuditRecord:
    """Append `entry` within the caller's unit of work (it commits or rolls back with the change)."""
    return audit_repo.append(session, entry)


def platform_change(session: Session, action: str, resource_type: str, resource_id: str,
                    tenant_id: str | None, summary: dict[str, Any] | None = None) -> AuditRecord:
    return record(session, Entry(actor=PLATFORM, action=action, resource_type=resource_type,
                                 resource_id=resource_id, tenant_id=tenant_id, summary=summary))


def operator_command(session: Session, action: str, resource_type: str, resource_id: str | None,
                     tenant_name: str | None = None, summary: dict[str, Any] | None = None) -> AuditRecord:
    """A change an operator made with the CLI on the platform's own database (no request, so no
    request id): the actor is `admin`, as on the admin API."""
    named = None if tenant_name is None else tenant_repo.by_name(session, tenant_name)
    return record(session, Entry(actor=ADMIN, action=action, resource_type=resource_type, resource_id=resource_id,
                                 tenant_id=None if named is None else named.tenant_id,
                                 summary={"via": "cli", **(summary or {})}))


@dataclass(frozen=True)
class RequestOutcome:
    """A mutating request as the edge saw it once answered. `api_key` is the tenant's presented
    key (looked up to name the key; never stored); `tenant_name` the tenant an admin route names."""

    audience: str  # tenant | admin
    action: str
    resource_type: str
    resource_id: str | None
    status_code: int
    request_id: str
    summary: dict[str, Any]
    api_key: str | None = None
    tenant_name: str | None = None
    tenant_id: str | None = None


def record_request(session: Session, outcome: RequestOutcome) -> AuditRecord | None:
    """Append the outcome; None when its caller is unknown (a tenant key that is no key: that
    request changed nothing and could flood the log)."""
    key_id = None
    tenant_id = outcome.tenant_id
    if outcome.audience == TENANT:
        found = tenant_repo.key_and_tenant(session, outcome.api_key) if outcome.api_key else None
        if found is None:
            return None
        key_id, tenant_id = found[0].key_id, found[1].tenant_id
        actor = TENANT
    else:
        actor = ADMIN
        if tenant_id is None and outcome.tenant_name is not None:
            named = tenant_repo.by_name(session, outcome.tenant_name)
            tenant_id = None if named is None else named.tenant_id
        elif tenant_id is None and outcome.resource_type == "models" and outcome.resource_id:
            model = model_repo.any_tenants(session, outcome.resource_id)  # an admin's move of a tenant's model
            tenant_id = None if model is None else model.tenant_id
    return record(session, Entry(actor=actor, action=outcome.action, resource_type=outcome.resource_type,
                                 resource_id=outcome.resource_id, tenant_id=tenant_id, key_id=key_id,
                                 status_code=outcome.status_code, request_id=outcome.request_id,
                                 summary=outcome.summary))


def entries(session: Session, *, tenant_id: str | None = None, resource_id: str | None = None,
            action: str | None = None, after: int | None = None,
            limit: int = 100) -> tuple[list[AuditRecord], bool]:
    return audit_repo.page(session, tenant_id=tenant_id, resource_id=resource_id, action=action,
                           after=after, limit=limit)


def view(row: AuditRecord) -> dict[str, Any]:
    return {"object": "audit.entry", "id": row.pk, "created_at": row.created_at, "actor": row.actor,
            "tenant_id": row.tenant_id, "key_id": row.key_id, "action": row.action,
            "resource_type": row.resource_type, "resource_id": row.resource_id,
            "status_code": row.status_code, "request_id": row.request_id, "summary": row.summary}
