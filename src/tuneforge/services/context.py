"""The platform's process-wide handles: settings, database and object store."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tuneforge.db.engine import Database
from tuneforge.executors.local import local_inventory
from tuneforge.executors.protocol import Capacity
from tuneforge.security.crypto import Sealer, sealer_for
from tuneforge.security.env import private_dirs
from tuneforge.services.stream_slots import StreamSlots
from tuneforge.services.tenancy.api_keys import KeyCache
from tuneforge.services.tenancy.data_keys import TenantKeyRing
from tuneforge.settings import Settings
from tuneforge.storage.envelope import EncryptingStore
from tuneforge.storage.store import FsspecStore, open_store

if TYPE_CHECKING:
    from tuneforge.serve.engine import InferenceEngine
    from tuneforge.serve.vllm import VllmHandoff
    from tuneforge.services.datasets.processing import FileChecks
    from tuneforge.services.training.queue_view import QueueEntry

_engine_lock = threading.Lock()
_file_checks_lock = threading.Lock()  # not the engine's: its first caller holds that while torch loads


@dataclass
class QueueMemo:
    """The queue as this process last computed it (`services/queue.queue_as_of`): as of which
    event, when, and what; `lock` lets one caller at a time compute it."""

    newest_event: int | None = None
    computed_at: float = 0.0
    entries: list[QueueEntry] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class Platform:
    settings: Settings
    db: Database
    store: FsspecStore
    inventory: Capacity | None = None  # the executor's last reported capacity (set by the scheduler); read capacity()
    scheduler_role: str = "off"  # "leader" | "standby" | "off", set by the scheduler thread
    inference: InferenceEngine | None = None  # created on first use: `inference_engine()`
    keys: KeyCache = field(default_factory=KeyCache)  # the API keys this process has verified
    queue: QueueMemo = field(default_factory=QueueMemo)  # the queue computed last, for a second
    vllm: VllmHandoff | None = None  # the vLLM hand-off, made on first use (`serve/vllm.handoff_for`)
    _sealer: Sealer | None = None
    _streams: StreamSlots | None = None
    _file_checks: FileChecks | None = None

    @property
    def sealer(self) -> Sealer:
        """Seals and opens tenant secrets and webhook signing secrets (security/crypto.py)."""
        if self._sealer is None:
            self._sealer = sealer_for(self.settings.secrets_key, self.settings.home)
        return self._sealer

    def __post_init__(self) -> None:
        # made here, not on first use: two first streams at once must count in one place
        if self._streams is None:
            self._streams = StreamSlots(self.settings.max_streams_per_tenant)

    @property
    def streams(self) -> StreamSlots:
        """The event streams open in this process, per tenant (bounded by max_streams_per_tenant)."""
        assert self._streams is not None
        return self._streams

    @classmethod
    def from_settings(cls, settings: Settings) -> Platform:
        private_dirs(settings.home)
        db = Database(settings.resolved_database_url, pool_size=settings.database_pool_size,
                      max_overflow=settings.database_max_overflow)
        if not settings.encrypt_tenant_objects:
            return cls(settings=settings, db=db, store=open_store(settings.resolved_storage_url,
                                                                  settings.storage_options()))
        sealer = sealer_for(settings.secrets_key, settings.home)
        store = EncryptingStore(settings.resolved_storage_url, settings.storage_options(),
                                keys=TenantKeyRing(db, sealer))
        return cls(settings=settings, db=db, store=store, _sealer=sealer)

    def inference_engine(self) -> InferenceEngine:
        """This process's inference engine, created by the first caller: torch and transformers
        load then, never when the API starts."""
        engine = self.inference
        if engine is None:
            with _engine_lock:
                if self.inference is None:
                    from tuneforge.serve.engine import InferenceEngine

                    self.inference = InferenceEngine.from_settings(self.settings, self.store)
                engine = self.inference
        return engine

    def file_checks(self) -> FileChecks:
        """This process's validations of uploaded files (services/datasets/processing.py), made by
        the first caller: an upload, or the scheduler's duty that resumes lost validations."""
        with _file_checks_lock:
            if self._file_checks is None:
                from tuneforge.services.datasets.processing import FileChecks

                self._file_checks = FileChecks(self)
            return self._file_checks

    def capacity(self) -> Capacity | None:
        """What the executor offers, as this process can know it — the one answer validation,
        the queue views and /metrics use. The live inventory when this process's scheduler has
        read one from its executor; otherwise the configured slots if the executor is `local`
        (they are known without asking); otherwise None: unknown (a standby or API-only control
        plane of a Ray platform has no view of the cluster), and nothing may be judged against
        it — no job fails as too large, no start time is estimated."""
        if self.inventory is not None:
            return self.inventory
        if self.settings.executor == "local":
            return local_inventory(self.settings)
        return None
