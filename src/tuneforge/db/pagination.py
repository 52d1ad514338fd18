"""Cursor pages in OpenAI's shape: newest first, `after` = last id seen."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sqlalchemy import Select, select
from sqlalchemy.orm import InstrumentedAttribute, Session

Row = TypeVar("Row")
MAX_LIMIT = 100


@dataclass
class Page(Generic[Row]):
    rows: Sequence[Row]
    has_more: bool


def newest_first(
    session: Session,
    stmt: Select,
    model: Any,
    id_column: InstrumentedAttribute,
    after: str | None,
    limit: int,
    *,
    ascending: bool = False,
) -> Page:
    """Rows of `stmt` newest first (or oldest first), starting after the row `after`."""
    limit = max(1, min(int(limit), MAX_LIMIT))
    if after:
        cursor_pk = session.scalar(select(model.pk).where(id_column == after))
        if cursor_pk is None:
            return Page(rows=[], has_more=False)
        stmt = stmt.where(model.pk > cursor_pk if ascending else model.pk < cursor_pk)
    order = model.pk.asc() if ascending else model.pk.desc()
    rows = list(session.scalars(stmt.order_by(order).limit(limit + 1)))
    return Page(rows=rows[:limit], has_more=len(rows) > limit)
