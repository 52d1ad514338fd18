"""the claim on a file validated in the background

`files.validation_owner`, `validation_heartbeat`: which control plane process runs the validation
of a file whose status is `processing`, and when it last renewed that claim; a claim not renewed
within the lease is taken over by the scheduler's `file_checks` duty. `validation_progress`: rows
and bytes checked so far. `validation_runs`: how many runs started (a file whose check keeps
ending its process fails after a few). `ix_files_status` finds the files still processing.

Revision ID: 0018
Revises: 0017
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("files") as batch:
        batch.add_column(sa.Column("validation_owner", sa.String(length=128), nullable=True))
        batch.add_column(sa.Column("validation_heartbeat", sa.Float(), nullable=True))
        batch.add_column(sa.Column("validation_progress", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("validation_runs", sa.Integer(), nullable=False, server_default="0"))
    op.create_index("ix_files_status", "files", ["status"])


def downgrade() -> None:
    op.drop_index("ix_files_status", table_name="files")
    with op.batch_alter_table("files") as batch:
        batch.drop_column("validation_runs")
        batch.drop_column("validation_progress")
        batch.drop_column("validation_heartbeat")
        batch.drop_column("validation_owner")
