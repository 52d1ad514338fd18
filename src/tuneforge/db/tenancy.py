"""Tenancy rule, in one place: a tenant-owned row is only ever selected
together with its owner's `tenant_id`. Another tenant's row is simply not
found, so the API answers 404 and shows nothing of it.

A job's child rows (attempts, events, checkpoints) have no `tenant_id` of
their own: they are selected through their job, which must belong to the
tenant (`of_job`), so a read of another tenant's job finds no children. A
sweep's trials are selected through their sweep in the same way (`of_sweep`)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, Select, and_, select

from tuneforge.db.tables import Job, Sweep


def owned(model, tenant_id: str) -> Select:  # noqa: ANN001 - any table with tenant_id
    """SELECT rows of `model` that belong to `tenant_id`."""
    return select(model).where(model.tenant_id == tenant_id)


def of_job(model: Any, tenant_id: str, job_id: str) -> ColumnElement[bool]:
    """WHERE clause: rows of `model` that belong to job `job_id`, if that job is `tenant_id`'s."""
    tenants_job = select(Job.job_id).where(Job.job_id == job_id, Job.tenant_id == tenant_id)
    return and_(model.job_id == job_id, model.job_id.in_(tenants_job))


def owned_by_job(model: Any, tenant_id: str, job_id: str) -> Select:
    """SELECT rows of `model` (a job's child table) of job `job_id`, if that job is `tenant_id`'s."""
    return select(model).where(of_job(model, tenant_id, job_id))


def of_sweep(model: Any, tenant_id: str, sweep_id: str) -> ColumnElement[bool]:
    """WHERE clause: rows of `model` that belong to sweep `sweep_id`, if that sweep is `tenant_id`'s."""
    tenants_sweep = select(Sweep.sweep_id).where(Sweep.sweep_id == sweep_id, Sweep.tenant_id == tenant_id)
    return and_(model.sweep_id == sweep_id, model.sweep_id.in_(tenants_sweep))
