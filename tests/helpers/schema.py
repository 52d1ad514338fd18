"""SQLite databases at the head revision for tests, copied from one migrated once per test process.

Creating tuneforge's schema (`upgrade` on an empty database: every table, then the stamp) costs
0.3-0.5 s, and hundreds of tests each start from it. `at_head` gives a test's SQLite file that does
not exist yet the same schema by copying a template that very `upgrade` built once, with SQLite's
backup API (milliseconds); the `upgrade` that follows then finds it at head, as it would have left
it. An existing file is left alone, so what tests of the migrations do never goes through here.
On PostgreSQL the database stays as it is: there a copy (CREATE DATABASE ... TEMPLATE) measured
no faster than creating the tables, the new database itself being the larger cost.
"""

from __future__ import annotations

import atexit
import shutil
import sqlite3
import tempfile
from pathlib import Path

from sqlalchemy.engine import make_url

from tuneforge.db.migrate import upgrade

_template: Path | None = None  # this process's SQLite file at head


def at_head(database_url: str) -> None:
    """Give the SQLite file `database_url` names, when it does not exist yet, the schema at head."""
    url = make_url(database_url)
    if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
        return
    path = Path(url.database)
    if not path.exists():
        _copy(_head_template(), path)


def _head_template() -> Path:
    global _template
    if _template is None:
        folder = tempfile.mkdtemp(prefix="tuneforge-schema-")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        path = Path(folder) / "head.db"
        upgrade(f"sqlite:///{path}")
        _template = path
    return _template


def _copy(template: Path, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    source, target = sqlite3.connect(template), sqlite3.connect(path)
    try:
        source.backup(target)
    finally:
        target.close()
        source.close()
