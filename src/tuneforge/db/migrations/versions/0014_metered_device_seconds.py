"""device time beside metered tokens

`metered_tokens.device_seconds`: the share of a shared device's time a batch of tokens took (the
training API's co-training cycles: each request's share of its cycle's pass), None where the
tokens were not spent on a device of this platform's (an operator's or a tenant's endpoint).

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("metered_tokens") as batch:
        batch.add_column(sa.Column("device_seconds", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("metered_tokens") as batch:
        batch.drop_column("device_seconds")
