"""uploads sent in parts, files that expire, checkpoints that know their epoch, jobs that continue
another model

`uploads` and `upload_parts` hold the Uploads API's state (a file over the
single-request limit, sent part by part); `files.expires_at` is the optional
expiry a file gets from `expires_after`; `checkpoints.epoch` the epoch a
checkpoint ends (retention counts epochs, as OpenAI's does); `jobs.parent` the
fine-tuned model or checkpoint a job continues from.

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("parent", sa.JSON(), nullable=True))
    with op.batch_alter_table("checkpoints") as batch:
        batch.add_column(sa.Column("epoch", sa.Integer(), nullable=True))
    with op.batch_alter_table("files") as batch:
        batch.add_column(sa.Column("expires_at", sa.BigInteger(), nullable=True))
        batch.create_index("ix_files_expires_at", ["expires_at"])
    op.create_table(
        "uploads",
        sa.Column("pk", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("upload_id", sa.String(length=64), nullable=False),
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("filename", sa.String(length=512), nullable=False),
        sa.Column("purpose", sa.String(length=32), nullable=False),
        sa.Column("mime_type", sa.String(length=255), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("received_bytes", sa.BigInteger(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("file_expires_after_s", sa.BigInteger(), nullable=True),
        sa.Column("file_id", sa.String(length=64), nullable=True),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.tenant_id"]),
        sa.PrimaryKeyConstraint("pk"),
        sa.UniqueConstraint("upload_id"),
    )
    op.create_index("ix_uploads_status", "uploads", ["status"])
    op.create_index("ix_uploads_expires_at", "uploads", ["expires_at"])
    op.create_table(
        "upload_parts",
        sa.Column("pk", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("part_id", sa.String(length=64), nullable=False),
        sa.Column("upload_id", sa.String(length=64), nullable=False),
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("key", sa.String(length=1024), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.tenant_id"]),
        sa.ForeignKeyConstraint(["upload_id"], ["uploads.upload_id"]),
        sa.PrimaryKeyConstraint("pk"),
        sa.UniqueConstraint("part_id"),
    )
    op.create_index("ix_upload_parts_upload_id", "upload_parts", ["upload_id"])


def downgrade() -> None:
    op.drop_index("ix_upload_parts_upload_id", table_name="upload_parts")
    op.drop_table("upload_parts")
    op.drop_index("ix_uploads_expires_at", table_name="uploads")
    op.drop_index("ix_uploads_status", table_name="uploads")
    op.drop_table("uploads")
    with op.batch_alter_table("files") as batch:
        batch.drop_index("ix_files_expires_at")
        batch.drop_column("expires_at")
    with op.batch_alter_table("checkpoints") as batch:
        batch.drop_column("epoch")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("parent")
