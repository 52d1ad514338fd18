"""hyperparameter sweeps and their trials

`sweeps` holds a tenant's sweeps (the checked request, status, best trial);
`sweep_trials` each trial's parameters, job, objective at each early-stopping
rung and final objective.

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sweeps",
        sa.Column("pk", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("sweep_id", sa.String(length=64), nullable=False),
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("best_job_id", sa.String(length=64), nullable=True),
        sa.Column("error", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("finished_at", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.tenant_id"]),
        sa.PrimaryKeyConstraint("pk"),
        sa.UniqueConstraint("sweep_id"),
    )
    op.create_index("ix_sweeps_status", "sweeps", ["status"])
    op.create_index("ix_sweeps_tenant_pk", "sweeps", ["tenant_id", "pk"])
    op.create_table(
        "sweep_trials",
        sa.Column("pk", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("sweep_id", sa.String(length=64), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.String(length=64), nullable=True),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("rungs", sa.JSON(), nullable=False),
        sa.Column("objective", sa.Float(), nullable=True),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["sweep_id"], ["sweeps.sweep_id"]),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.job_id"]),
        sa.PrimaryKeyConstraint("pk"),
        sa.UniqueConstraint("sweep_id", "number", name="uq_sweep_trials_sweep_number"),
    )
    op.create_index("ix_sweep_trials_sweep_id", "sweep_trials", ["sweep_id"])


def downgrade() -> None:
    op.drop_index("ix_sweep_trials_sweep_id", table_name="sweep_trials")
    op.drop_table("sweep_trials")
    op.drop_index("ix_sweeps_tenant_pk", table_name="sweeps")
    op.drop_index("ix_sweeps_status", table_name="sweeps")
    op.drop_table("sweeps")
