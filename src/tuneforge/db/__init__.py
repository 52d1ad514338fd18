"""Metadata store: SQLAlchemy 2 tables, engine, repositories and Alembic migrations."""

from sqlalchemy.orm import Session  # noqa: F401 - the session type, for callers that import no SQLAlchemy
