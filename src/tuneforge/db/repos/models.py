"""Fine-tuned models and their stage history. Reads take the tenant; the platform-side scans
(the operator's look-up of any tenant's model, the adapters to hand to vLLM, the models past their
grace period) say so where they are."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from tuneforge.db.tables import FineTunedModel, ModelStageChange
from tuneforge.db.tenancy import owned


def get(session: Session, tenant_id: str, model_id: str) -> FineTunedModel | None:
    return session.scalar(owned(FineTunedModel, tenant_id).where(FineTunedModel.model_id == model_id))


def list_for_tenant(session: Session, tenant_id: str) -> list[FineTunedModel]:
    return list(session.scalars(owned(FineTunedModel, tenant_id).order_by(FineTunedModel.pk)))


def without_job(session: Session, tenant_id: str) -> list[FineTunedModel]:
    """The tenant's models no job made (registered from training-API checkpoints)."""
    return list(session.scalars(owned(FineTunedModel, tenant_id).where(FineTunedModel.job_id.is_(None))
                                .order_by(FineTunedModel.pk)))


def of_job(session: Session, tenant_id: str, job_id: str) -> FineTunedModel | None:
    """The model the tenant's job `job_id` registered, if any."""
    return session.scalar(owned(FineTunedModel, tenant_id).where(FineTunedModel.job_id == job_id)
                          .order_by(FineTunedModel.pk).limit(1))


def any_tenants(session: Session, model_id: str) -> FineTunedModel | None:
    """The model `model_id` of whichever tenant it is (platform-wide on purpose: operators only)."""
    return session.scalar(select(FineTunedModel).where(FineTunedModel.model_id == model_id))


def same_config(session: Session, tenant_id: str, config_hash: str,
                exclude_job: str | None = None) -> FineTunedModel | None:
    """The tenant's first model trained with configuration hash `config_hash`, not by job `exclude_job`."""
    query = owned(FineTunedModel, tenant_id).where(FineTunedModel.config_hash == config_hash)
    if exclude_job:
        query = query.where(FineTunedModel.job_id != exclude_job)
    return session.scalars(query.order_by(FineTunedModel.pk)).first()


def listing(session: Session, tenant_id: str, *, base_model: str | None, stage: str | None,
            include_deprecated: bool) -> list[FineTunedModel]:
    """The tenant's models whose artifacts are kept, oldest first, of `base_model` and in `stage`
    when given; deprecated (deleted) ones only with `include_deprecated`."""
    query = owned(FineTunedModel, tenant_id).where(FineTunedModel.artifacts_deleted_at.is_(None))
    if base_model:
        query = query.where(FineTunedModel.base_model == base_model)
    if stage:
        query = query.where(FineTunedModel.stage == stage)
    if not include_deprecated:
        query = query.where(FineTunedModel.deprecated_at.is_(None))
    return list(session.scalars(query.order_by(FineTunedModel.pk)))


def stage_changes(session: Session, tenant_id: str, model_id: str) -> list[ModelStageChange]:
    """The stage history of the tenant's model `model_id`, oldest first."""
    return list(session.scalars(owned(ModelStageChange, tenant_id).where(ModelStageChange.model_id == model_id)
                                .order_by(ModelStageChange.pk)))


def past_grace(session: Session, now: float) -> list[FineTunedModel]:
    """Deleted models whose grace period is over at `now` and whose artifacts are still stored, every
    tenant's (platform-wide on purpose: the housekeeping that removes them)."""
    return list(session.scalars(select(FineTunedModel).where(
        FineTunedModel.delete_after.is_not(None), FineTunedModel.delete_after <= now,
        FineTunedModel.artifacts_deleted_at.is_(None))).all())


def live_adapters_of(session: Session, bases: Sequence[str]) -> list[FineTunedModel]:
    """Every tenant's adapters on one of `bases` that are neither deleted nor purged, oldest first
    (platform-wide on purpose: the vLLM servers hold the adapters of every tenant)."""
    return list(session.scalars(select(FineTunedModel).where(
        FineTunedModel.base_model.in_(bases), FineTunedModel.artifact_kind == "adapter",
        FineTunedModel.deprecated_at.is_(None), FineTunedModel.artifacts_deleted_at.is_(None))
        .order_by(FineTunedModel.pk)).all())
