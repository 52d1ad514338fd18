"""the audit log; tenant deletion

`audit_log`: every mutation of the platform's state (who, what, when, the request), appended and
never changed. On PostgreSQL a trigger refuses UPDATE and DELETE of its rows; SQLite has only the
code's word for it (db/repos/audit.py offers neither).

`tenants.deleted_at`, `export_key`, `purged_at`: a deleted tenant's row stays as a tombstone that
its billing rows still name.

Revision ID: 0016
Revises: 0015
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

_REFUSE = """
CREATE OR REPLACE FUNCTION audit_log_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'audit_log is append-only: % refused', TG_OP;
END;
$$ LANGUAGE plpgsql
"""


def upgrade() -> None:
    with op.batch_alter_table("tenants") as batch:
        batch.add_column(sa.Column("deleted_at", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("export_key", sa.String(length=1024), nullable=True))
        batch.add_column(sa.Column("purged_at", sa.BigInteger(), nullable=True))
    op.create_table(
        "audit_log",
        sa.Column("pk", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("actor", sa.String(length=16), nullable=False),
        sa.Column("tenant_id", sa.String(length=64), nullable=True),
        sa.Column("key_id", sa.String(length=64), nullable=True),
        sa.Column("action", sa.String(length=128), nullable=False),
        sa.Column("resource_type", sa.String(length=64), nullable=False),
        sa.Column("resource_id", sa.String(length=256), nullable=True),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("request_id", sa.String(length=64), nullable=True),
        sa.Column("summary", sa.JSON(), nullable=True),
    )
    op.create_index("ix_audit_log_tenant_pk", "audit_log", ["tenant_id", "pk"])
    op.create_index("ix_audit_log_resource", "audit_log", ["resource_id"])
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_REFUSE)
        op.execute("CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log "
                   "FOR EACH ROW EXECUTE FUNCTION audit_log_append_only()")
        op.execute("CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log "
                   "FOR EACH STATEMENT EXECUTE FUNCTION audit_log_append_only()")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS audit_log_no_truncate ON audit_log")
        op.execute("DROP TRIGGER IF EXISTS audit_log_append_only ON audit_log")
        op.execute("DROP FUNCTION IF EXISTS audit_log_append_only()")
    op.drop_index("ix_audit_log_resource", table_name="audit_log")
    op.drop_index("ix_audit_log_tenant_pk", table_name="audit_log")
    op.drop_table("audit_log")
    with op.batch_alter_table("tenants") as batch:
        batch.drop_column("purged_at")
        batch.drop_column("export_key")
        batch.drop_column("deleted_at")
