"""The platform's process-wide handles: settings, database and object store."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tuneforge.db.engine import Database
from tuneforge.settings import Settings
from tuneforge.storage.store import FsspecStore, open_store


@dataclass
class Platform:
    settings: Settings
    db: Database
    store: FsspecStore
    inventory: Any = None  # the executor's last reported Capacity (set by the scheduler), for queue views
    scheduler_role: str = "off"  # "leader" | "standby" | "off", set by the scheduler thread
    inference: Any = None  # serve.InferenceEngine, created on first use by serve.engine_for

    @classmethod
    def from_settings(cls, settings: Settings) -> "Platform":
        settings.home.mkdir(parents=True, exist_ok=True)
        return cls(
            settings=settings,
            db=Database(settings.resolved_database_url),
            store=open_store(settings.resolved_storage_url, settings.storage_options()),
        )
