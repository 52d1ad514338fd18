from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from tuneforge.db.tables import BaseModelRow


def by_name(session: Session, name: str) -> BaseModelRow | None:
    return session.scalar(select(BaseModelRow).where(BaseModelRow.name == name))


def list_all(session: Session) -> list[BaseModelRow]:
    return list(session.scalars(select(BaseModelRow).order_by(BaseModelRow.pk)))
