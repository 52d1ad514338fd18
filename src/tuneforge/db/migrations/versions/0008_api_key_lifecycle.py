"""api keys: a public id, an optional label, an expiry and the time of last use

Keys issued before this revision get a generated id, no label, no expiry.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from tuneforge.domain.ids import new_id

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_BATCH = 500

# the columns this migration reads and writes, as they are at this revision
_keys = sa.table("api_keys", sa.column("pk", sa.Integer), sa.column("key_id", sa.String))


def upgrade() -> None:
    with op.batch_alter_table("api_keys") as batch_op:
        batch_op.add_column(sa.Column("key_id", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("name", sa.String(length=128), nullable=True))
        batch_op.add_column(sa.Column("expires_at", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("last_used_at", sa.BigInteger(), nullable=True))
    connection = op.get_bind()
    while True:
        pks = connection.execute(sa.select(_keys.c.pk).where(_keys.c.key_id.is_(None))
                                 .order_by(_keys.c.pk).limit(_BATCH)).scalars().all()
        if not pks:
            break
        for pk in pks:
            connection.execute(_keys.update().where(_keys.c.pk == pk).values(key_id=new_id("key")))
    with op.batch_alter_table("api_keys") as batch_op:
        batch_op.alter_column("key_id", existing_type=sa.String(length=64), nullable=False)
        batch_op.create_index("ix_api_keys_key_id", ["key_id"], unique=True)


def downgrade() -> None:
    with op.batch_alter_table("api_keys") as batch_op:
        batch_op.drop_index("ix_api_keys_key_id")
        for column in ("last_used_at", "expires_at", "name", "key_id"):
            batch_op.drop_column(column)
