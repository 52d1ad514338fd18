"""tenants' data keys

`tenant_data_keys`: each tenant's key for its objects' data keys (envelope encryption,
storage/envelope.py), sealed under the operator's key; revocation erases the sealed key.

Revision ID: 0017
Revises: 0016
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tenant_data_keys",
        sa.Column("pk", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("key_id", sa.String(length=64), nullable=False, unique=True),
        sa.Column("sealed", sa.Text(), nullable=True),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("revoked_at", sa.BigInteger(), nullable=True),
    )
    op.create_index("ix_tenant_data_keys_tenant_id", "tenant_data_keys", ["tenant_id"])


def downgrade() -> None:
    op.drop_index("ix_tenant_data_keys_tenant_id", table_name="tenant_data_keys")
    op.drop_table("tenant_data_keys")
