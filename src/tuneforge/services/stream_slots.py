"""How many event streams each tenant holds open in this process, and the bound on it.

A stream takes a slot before its response starts (one too many answers 429
then, with Retry-After) and gives it back when it ends: the job finished, the
client went away, or the server is shutting down. Counted per process under a
lock; API processes do not share counts, so with several of them a tenant may
hold the bound in each.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field

from tuneforge.db.notify import HUB
from tuneforge.domain.errors import rate_limited

# A slot frees when another stream of the tenant ends, which is not predictable; this is when a client
# may try again without hammering.
RETRY_AFTER_S = 5.0


@dataclass(eq=False)
class StreamSlot:
    tenant_id: str
    job_id: str
    _slots: StreamSlots = field(repr=False)
    released: bool = False

    def release(self) -> None:
        """Idempotent: a stream's end and its response's clean-up may both call it."""
        self._slots.release(self)


class StreamSlots:
    def __init__(self, max_per_tenant: int) -> None:
        self.max_per_tenant = max_per_tenant
        self._lock = threading.Lock()
        self._open: set[StreamSlot] = set()
        self._per_tenant: Counter[str] = Counter()
        self._closing = False

    @property
    def closing(self) -> bool:
        """Set by `close`: streams end (without `[DONE]`; clients resume with Last-Event-ID)."""
        return self._closing

    def acquire(self, tenant_id: str, job_id: str) -> StreamSlot:
        with self._lock:
            held = self._per_tenant[tenant_id]
            if held >= self.max_per_tenant:
                raise rate_limited(
                    f"Too many open event streams: this tenant holds {held}, the limit is {self.max_per_tenant} "
                    "(TUNEFORGE_MAX_STREAMS_PER_TENANT). Close one, or try again later.",
                    code="too_many_streams", retry_after=RETRY_AFTER_S)
            slot = StreamSlot(tenant_id, job_id, self)
            self._open.add(slot)
            self._per_tenant[tenant_id] += 1
            return slot

    def release(self, slot: StreamSlot) -> None:
        with self._lock:
            if slot.released:
                return
            slot.released = True
            self._open.discard(slot)
            self._per_tenant[slot.tenant_id] -= 1
            if self._per_tenant[slot.tenant_id] <= 0:
                del self._per_tenant[slot.tenant_id]

    def open_streams(self, tenant_id: str | None = None) -> int:
        with self._lock:
            return self._per_tenant[tenant_id] if tenant_id is not None else len(self._open)

    def close(self) -> None:
        """The server is stopping: wake every open stream so that it ends now rather than hold
        the shutdown until its connection is cut."""
        with self._lock:
            self._closing = True
            job_ids = {slot.job_id for slot in self._open}
        HUB.notify(job_ids)
