"""quotas: per-tenant overrides of the tier's job and GPU-hour limits

Metering needs no column: GPU-seconds are computed from the attempts' start,
end and GPU count, so a retried report can never count an attempt twice.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tenants") as batch_op:
        batch_op.add_column(sa.Column("max_concurrent_jobs", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("max_queued_jobs", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("gpu_hours_hard", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("gpu_hours_soft", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tenants") as batch_op:
        batch_op.drop_column("gpu_hours_soft")
        batch_op.drop_column("gpu_hours_hard")
        batch_op.drop_column("max_queued_jobs")
        batch_op.drop_column("max_concurrent_jobs")
