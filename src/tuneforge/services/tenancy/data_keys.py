"""Tenants' data keys: the keys that wrap the per-object keys of a tenant's objects
(storage/envelope.py), each sealed under the operator's key (security/crypto.py: the key file in
the platform's home, or TUNEFORGE_SECRETS_KEY from the operator's secret manager or KMS).

A tenant gets its key when its first object is written. `revoke` erases the sealed key: from then
on nothing the tenant stored can be opened — by the platform, a backup of the bucket, or anyone
holding a copy of the bytes — and writing under the tenant's prefix fails too (tenant deletion
revokes after its export). A key this process opened is kept in memory for `CACHE_S` seconds, so a
revocation reaches the other control-plane processes within that time.
"""

from __future__ import annotations

import base64
import os
import secrets
import threading
import time

from sqlalchemy.orm import Session

from tuneforge.db.engine import Database
from tuneforge.db.repos import secrets as repo
from tuneforge.db.tables import TenantDataKey
from tuneforge.security.crypto import Sealer
from tuneforge.storage.envelope import KeyUnavailable

CACHE_S = 10.0


class TenantKeyRing:
    """`storage.envelope.TenantKeys` over the database: keys made on first use, sealed at rest."""

    def __init__(self, db: Database, sealer: Sealer, *, clock: object = time.monotonic) -> None:
        self.db, self.sealer = db, sealer
        self._clock = clock
        self._opened: dict[str, tuple[float, str, bytes]] = {}  # key id -> (when, tenant, key)
        self._current: dict[str, tuple[float, str]] = {}  # tenant -> (when, key id)
        self._lock = threading.Lock()

    def _now(self) -> float:
        return float(self._clock())  # type: ignore[operator]

    def current(self, tenant_id: str) -> tuple[str, bytes]:
        with self._lock:
            known = self._current.get(tenant_id)
        if known is not None and self._now() - known[0] < CACHE_S:
            return known[1], self.key(tenant_id, known[1])
        with self.db.session() as session:
            row = repo.newest_data_key(session, tenant_id)
            if row is not None and row.revoked_at is not None:
                raise KeyUnavailable(f"the data key of tenant {tenant_id} is revoked")
            if row is None:
                key = os.urandom(32)
                row = TenantDataKey(tenant_id=tenant_id, key_id=f"tdk-{secrets.token_hex(12)}",
                                    sealed=self.sealer.seal(base64.b64encode(key).decode()),
                                    created_at=int(time.time()))
                session.add(row)
            key_id = row.key_id
        # two processes making a first key at once: each object names its own key, both stay good
        with self._lock:
            self._current[tenant_id] = (self._now(), key_id)
        return key_id, self.key(tenant_id, key_id)

    def key(self, tenant_id: str, key_id: str) -> bytes:
        with self._lock:
            known = self._opened.get(key_id)
        if known is not None and known[1] == tenant_id and self._now() - known[0] < CACHE_S:
            return known[2]
        with self.db.session() as session:
            row = repo.data_key(session, key_id)
            if row is None or row.tenant_id != tenant_id:
                raise KeyUnavailable(f"no data key {key_id} of tenant {tenant_id}")
            if row.sealed is None or row.revoked_at is not None:
                raise KeyUnavailable(f"the data key {key_id} of tenant {tenant_id} is revoked")
            key = base64.b64decode(self.sealer.open(row.sealed))
        with self._lock:
            self._opened[key_id] = (self._now(), tenant_id, key)
        return key

    def revoke(self, tenant_id: str, session: Session | None = None) -> int:
        """Erase every key of the tenant; returns how many were live. Irreversible. In `session`
        when given (the caller commits: tenant deletion), else in a unit of work of its own."""
        if session is None:
            with self.db.session() as own:
                return self.revoke(tenant_id, own)
        now = int(time.time())
        rows = repo.live_data_keys(session, tenant_id)
        for row in rows:
            row.sealed, row.revoked_at = None, now
        if not rows:  # nothing stored yet: a revoked marker still refuses later writes
            session.add(TenantDataKey(tenant_id=tenant_id, key_id=f"tdk-{secrets.token_hex(12)}",
                                      sealed=None, created_at=now, revoked_at=now))
        with self._lock:
            self._current.pop(tenant_id, None)
            for key_id in [k for k, (_, owner, _) in self._opened.items() if owner == tenant_id]:
                del self._opened[key_id]
        return len(rows)
