"""Sweeps and their trials. Reads of one sweep take the tenant and find nothing of another
tenant's sweep (`db/tenancy.owned`, `of_sweep`); the scheduler's pass over every running
sweep (`running_ids`, `get_for_update`) is platform-side."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from tuneforge.db.tables import Sweep, SweepTrial
from tuneforge.db.tenancy import of_sweep, owned


def get(session: Session, tenant_id: str, sweep_id: str) -> Sweep | None:
    return session.scalar(owned(Sweep, tenant_id).where(Sweep.sweep_id == sweep_id))


def of_tenant(session: Session, tenant_id: str, limit: int) -> list[Sweep]:
    """The tenant's newest `limit` sweeps, newest first."""
    return list(session.scalars(owned(Sweep, tenant_id).order_by(Sweep.pk.desc()).limit(limit)))


def trials(session: Session, tenant_id: str, sweep_id: str) -> list[SweepTrial]:
    """The sweep's trials by number, if the sweep is `tenant_id`'s."""
    return list(session.scalars(select(SweepTrial).where(of_sweep(SweepTrial, tenant_id, sweep_id))
                                .order_by(SweepTrial.number)))


def running_ids(session: Session) -> list[str]:
    """Every tenant's running sweeps (platform-side: the scheduler's)."""
    return list(session.scalars(select(Sweep.sweep_id).where(Sweep.status == "running").order_by(Sweep.pk)))


def get_for_update(session: Session, sweep_id: str) -> Sweep | None:
    """Platform-side lookup, row-locked on PostgreSQL, so two passes never advance one sweep at once."""
    return session.scalar(select(Sweep).where(Sweep.sweep_id == sweep_id).with_for_update())
