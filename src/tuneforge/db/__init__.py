"""Metadata store: SQLAlchemy 2 tables, engine, repositories and Alembic migrations."""
