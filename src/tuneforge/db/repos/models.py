from __future__ import annotations

from sqlalchemy.orm import Session

from tuneforge.db.tables import FineTunedModel
from tuneforge.db.tenancy import owned


def get(session: Session, tenant_id: str, model_id: str) -> FineTunedModel | None:
    return session.scalar(owned(FineTunedModel, tenant_id).where(FineTunedModel.model_id == model_id))


def list_for_tenant(session: Session, tenant_id: str) -> list[FineTunedModel]:
    return list(session.scalars(owned(FineTunedModel, tenant_id).order_by(FineTunedModel.pk)))


def of_job(session: Session, tenant_id: str, job_id: str) -> FineTunedModel | None:
    """The model the tenant's job `job_id` registered, if any."""
    return session.scalar(owned(FineTunedModel, tenant_id).where(FineTunedModel.job_id == job_id)
                          .order_by(FineTunedModel.pk).limit(1))
