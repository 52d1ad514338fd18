"""dataset checks: file example kind, tenant PII policy, base model size

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("base_models") as batch_op:
        batch_op.add_column(sa.Column("num_parameters", sa.BigInteger(), nullable=True))
    with op.batch_alter_table("files") as batch_op:
        batch_op.add_column(sa.Column("data_kind", sa.String(length=32), nullable=True))
    with op.batch_alter_table("tenants") as batch_op:
        batch_op.add_column(sa.Column("pii_policy", sa.String(length=16), nullable=False, server_default="warn"))


def downgrade() -> None:
    with op.batch_alter_table("tenants") as batch_op:
        batch_op.drop_column("pii_policy")
    with op.batch_alter_table("files") as batch_op:
        batch_op.drop_column("data_kind")
    with op.batch_alter_table("base_models") as batch_op:
        batch_op.drop_column("num_parameters")
