"""fault tolerance: attempt failure class, retry backoff, pause requests

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("attempts") as batch_op:
        batch_op.add_column(sa.Column("failure_class", sa.String(length=16), nullable=True))
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.add_column(sa.Column("not_before", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("pause_requested", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.drop_column("pause_requested")
        batch_op.drop_column("not_before")
    with op.batch_alter_table("attempts") as batch_op:
        batch_op.drop_column("failure_class")
