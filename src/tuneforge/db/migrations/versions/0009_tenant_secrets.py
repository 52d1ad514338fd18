"""tenant secrets, and room for sealed webhook signing secrets

Tenants store credentials (their judge's API key, ...) as named secrets, sealed
at rest; webhook signing secrets are sealed too, which makes them longer than
the 128 characters their column had. Existing signing secrets stay readable as
they are until `tuneforge secrets rotate` seals them.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tenant_secrets",
        sa.Column("pk", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.tenant_id"]),
        sa.PrimaryKeyConstraint("pk"),
        sa.UniqueConstraint("tenant_id", "name", name="uq_tenant_secrets_tenant_name"),
    )
    with op.batch_alter_table("webhook_endpoints") as batch:
        batch.alter_column("secret", existing_type=sa.String(length=128), type_=sa.Text(), existing_nullable=False)


def downgrade() -> None:
    # sealed signing secrets do not fit the old column: a downgrade needs them unsealed first
    with op.batch_alter_table("webhook_endpoints") as batch:
        batch.alter_column("secret", existing_type=sa.Text(), type_=sa.String(length=128), existing_nullable=False)
    op.drop_table("tenant_secrets")
