"""registry: stages, gates, lineage and deprecation of fine-tuned models; the stage audit trail;
the configuration hash of a job

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("fine_tuned_models") as batch_op:
        batch_op.add_column(sa.Column("artifact_kind", sa.String(length=16), nullable=False,
                                      server_default="adapter"))
        batch_op.add_column(sa.Column("stage", sa.String(length=16), nullable=False, server_default="dev"))
        batch_op.add_column(sa.Column("promotable", sa.Boolean(), nullable=False, server_default=sa.true()))
        batch_op.add_column(sa.Column("eval_results", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("gate_report", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("lineage", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("config_hash", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("deprecated_at", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("delete_after", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("artifacts_deleted_at", sa.BigInteger(), nullable=True))
        batch_op.create_index("ix_fine_tuned_models_config_hash", ["config_hash"])
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.add_column(sa.Column("config_hash", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("eval_results", sa.JSON(), nullable=True))
    op.create_table(
        "model_stage_changes",
        sa.Column("pk", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("model_id", sa.String(length=256), sa.ForeignKey("fine_tuned_models.model_id"), nullable=False),
        sa.Column("tenant_id", sa.String(length=64), sa.ForeignKey("tenants.tenant_id"), nullable=False),
        sa.Column("from_stage", sa.String(length=16), nullable=False),
        sa.Column("to_stage", sa.String(length=16), nullable=False),
        sa.Column("actor", sa.String(length=128), nullable=False),
        sa.Column("override", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
    )
    op.create_index("ix_model_stage_changes_model_id", "model_stage_changes", ["model_id"])


def downgrade() -> None:
    op.drop_index("ix_model_stage_changes_model_id", table_name="model_stage_changes")
    op.drop_table("model_stage_changes")
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.drop_column("eval_results")
        batch_op.drop_column("config_hash")
    with op.batch_alter_table("fine_tuned_models") as batch_op:
        batch_op.drop_index("ix_fine_tuned_models_config_hash")
        for column in ("artifacts_deleted_at", "delete_after", "deprecated_at", "config_hash", "lineage",
                       "gate_report", "eval_results", "promotable", "stage", "artifact_kind"):
            batch_op.drop_column(column)
