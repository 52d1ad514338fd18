"""Tenancy rule, in one place: a tenant-owned row is only ever selected
together with its owner's `tenant_id`. Another tenant's row is simply not
found, so the API answers 404 and shows nothing of it."""

from __future__ import annotations

from sqlalchemy import Select, select


def owned(model, tenant_id: str) -> Select:  # noqa: ANN001 - any table with tenant_id
    """SELECT rows of `model` that belong to `tenant_id`."""
    return select(model).where(model.tenant_id == tenant_id)
