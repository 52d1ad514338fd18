"""tokens metered to tenants beside GPU time

`metered_tokens` holds one row per batch of tokens a tenant spent (the judges
of its graders), by kind and model, with the job when a job spent them.

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "metered_tokens",
        sa.Column("pk", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("job_id", sa.String(length=64), nullable=True),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("model", sa.String(length=256), nullable=False),
        sa.Column("requests", sa.Integer(), nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
        sa.Column("completion_tokens", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.tenant_id"]),
        sa.PrimaryKeyConstraint("pk"),
    )
    op.create_index("ix_metered_tokens_tenant_created", "metered_tokens", ["tenant_id", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_metered_tokens_tenant_created", table_name="metered_tokens")
    op.drop_table("metered_tokens")
