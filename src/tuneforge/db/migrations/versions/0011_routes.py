"""A/B routes between model versions, and the requests they served

`routes` holds a tenant's routes (a name, and the versions it splits traffic
between by weight); `route_requests` one row per request a route served: the
version, outcome, latency, tokens and the feedback score given to the answer.

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "routes",
        sa.Column("pk", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("route_id", sa.String(length=64), nullable=False),
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("versions", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.tenant_id"]),
        sa.PrimaryKeyConstraint("pk"),
        sa.UniqueConstraint("route_id"),
        sa.UniqueConstraint("tenant_id", "name", name="uq_routes_tenant_name"),
    )
    op.create_table(
        "route_requests",
        sa.Column("pk", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("response_id", sa.String(length=64), nullable=False),
        sa.Column("route_id", sa.String(length=64), nullable=False),
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("model", sa.String(length=256), nullable=False),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("latency_ms", sa.Float(), nullable=False),
        sa.Column("first_token_ms", sa.Float(), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("feedback", sa.Float(), nullable=True),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["route_id"], ["routes.route_id"]),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.tenant_id"]),
        sa.PrimaryKeyConstraint("pk"),
        sa.UniqueConstraint("response_id"),
    )
    op.create_index("ix_route_requests_route_created", "route_requests", ["route_id", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_route_requests_route_created", table_name="route_requests")
    op.drop_table("route_requests")
    op.drop_table("routes")
