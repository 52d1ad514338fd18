"""jobs.resolved records the job's method and training type (data only, no schema change)

A resolved job now says which method it trains and what it trains (the trainer's
spec is built from it alone). Rows resolved before carry neither; they get them
from the request they were resolved from.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_BATCH = 500

# the columns this migration reads and writes, as they are at this revision
_jobs = sa.table("jobs", sa.column("pk", sa.Integer), sa.column("request", sa.JSON), sa.column("resolved", sa.JSON))


def upgrade() -> None:
    connection = op.get_bind()
    last_pk = 0
    while True:
        rows = connection.execute(
            sa.select(_jobs.c.pk, _jobs.c.request, _jobs.c.resolved)
            .where(_jobs.c.pk > last_pk).order_by(_jobs.c.pk).limit(_BATCH)).all()
        if not rows:
            return
        for pk, request, resolved in rows:
            if isinstance(resolved, dict) and not {"method", "training_type"} <= resolved.keys():
                connection.execute(_jobs.update().where(_jobs.c.pk == pk).values(
                    resolved={**_asked(request or {}), **resolved}))
        last_pk = rows[-1][0]


def _asked(request: dict) -> dict[str, str]:
    """The request's method and training type, with the defaults the platform has always applied
    (written out here: a migration keeps the rule of its time, whatever the code says later)."""
    return {"method": (request.get("method") or {}).get("type") or "supervised",
            "training_type": (request.get("training_type") or {}).get("type") or "lora"}


def downgrade() -> None:
    """Nothing to undo: the code before this revision reads `resolved` by key and never looks at
    the two keys this revision adds, so rows keep them."""
