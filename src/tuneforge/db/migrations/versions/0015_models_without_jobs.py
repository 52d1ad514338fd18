"""fine-tuned models registered without a job

`fine_tuned_models.job_id` may be null: a model registered from a training-API checkpoint
(`POST /v1/models`) was trained by no job; its lineage names the training run and checkpoint.

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("fine_tuned_models") as batch:
        batch.alter_column("job_id", existing_type=sa.String(length=64), nullable=True)


def downgrade() -> None:
    op.execute("DELETE FROM model_stage_changes WHERE model_id IN "
               "(SELECT model_id FROM fine_tuned_models WHERE job_id IS NULL)")
    op.execute("DELETE FROM fine_tuned_models WHERE job_id IS NULL")
    with op.batch_alter_table("fine_tuned_models") as batch:
        batch.alter_column("job_id", existing_type=sa.String(length=64), nullable=False)
