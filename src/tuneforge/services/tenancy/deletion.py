"""Deleting a tenant: export, stop, then remove everything but its billing.

`delete_tenant` (the admin API's `DELETE /v1/admin/tenants/{name}`, `tuneforge tenants delete`):

1. revokes every API key of the tenant and cancels its unfinished jobs through the ordinary cancel
   path (a running trainer is signalled by the scheduler on its next tick, through the executor);
2. writes the export archive, `admin/tenant-exports/{tenant_id}/{unix time}.json` in the object
   store: every row of the tenant (credentials left out: key hashes, sealed secrets, webhook
   signing secrets) and the key and size of every object under its prefix;
3. purges: deletes every object under `tenants/{tenant_id}/` and every row of the tenant except
   its billing (db/repos/tenant_data.py says which), keeping the tenant row as a tombstone; under
   envelope encryption its data key is erased too, so copies of its objects elsewhere (backups,
   replicas) can no longer be opened.

While a trainer of the tenant is still stopping, step 3 waits: the answer says `deleting`, and the
scheduler's `tenant_purge` duty (or the same request again) purges once no attempt is active. The
whole is idempotent: asking again for a deleted tenant answers what was done.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from tuneforge.db.repos import tenant_data
from tuneforge.db.repos import tenants as tenant_repo
from tuneforge.domain.errors import not_found
from tuneforge.domain.status import ATTEMPT_ACTIVE, TERMINAL
from tuneforge.services.tenancy import audit
from tuneforge.services.tenancy.data_keys import TenantKeyRing
from tuneforge.storage import layout
from tuneforge.storage.envelope import EncryptingStore
from tuneforge.storage.store import ObjectStore

_ACTIVE = [status.value for status in ATTEMPT_ACTIVE]
_TERMINAL = [status.value for status in TERMINAL]


@dataclass
class Deletion:
    tenant_id: str
    name: str
    status: str  # deleting | deleted
    export_key: str | None
    jobs_cancelled: list[str] = field(default_factory=list)
    keys_revoked: int = 0
    objects_deleted: int = 0
    data_keys_erased: int = 0
    rows_deleted: dict[str, int] = field(default_factory=dict)

    def view(self) -> dict[str, Any]:
        return {"object": "tenant.deletion", "id": self.tenant_id, "name": self.name, "status": self.status,
                "export_key": self.export_key, "jobs_cancelled": self.jobs_cancelled,
                "keys_revoked": self.keys_revoked, "objects_deleted": self.objects_deleted,
                "data_keys_erased": self.data_keys_erased,
                "rows_deleted": self.rows_deleted}


def delete_tenant(session: Session, store: ObjectStore, name: str, *, now: float | None = None) -> Deletion:
    """Delete tenant `name` (see the module's description); the caller commits. 404 for a name no
    tenant ever had."""
    from tuneforge.services.training import jobs as job_service  # the training room cancels its jobs

    now = time.time() if now is None else now
    tenant = tenant_repo.by_name(session, name)
    if tenant is None:
        raise not_found(f"no tenant named {name!r}", param="name", code="tenant_not_found")
    tenant_repo.lock(session, tenant.tenant_id)
    deletion = Deletion(tenant.tenant_id, tenant.name, "deleting", tenant.export_key)
    if tenant.deleted_at is None:
        for key in tenant_repo.keys_of(session, tenant.tenant_id):
            if key.revoked_at is None:
                key.revoked_at = int(now)
                deletion.keys_revoked += 1
        for job in tenant_data.unfinished_jobs(session, tenant.tenant_id, _TERMINAL):
            job_service.cancel_job(session, tenant.tenant_id, job.job_id, store)
            deletion.jobs_cancelled.append(job.job_id)
        deletion.export_key = _export(session, store, tenant.tenant_id, tenant.name, int(now))
        tenant.deleted_at, tenant.export_key = int(now), deletion.export_key
        audit.platform_change(session, "tenant.export", "tenants", tenant.tenant_id, tenant.tenant_id,
                              {"export_key": deletion.export_key})
    if tenant.purged_at is None and tenant_data.active_attempts(session, tenant.tenant_id, _ACTIVE) == 0:
        purge(session, store, tenant.tenant_id, deletion, now)
        tenant.purged_at = int(now)
    if tenant.purged_at is not None:
        deletion.status = "deleted"
    return deletion


def _export(session: Session, store: ObjectStore, tenant_id: str, name: str, stamp: int) -> str:
    prefix = layout.tenant_prefix(tenant_id)
    objects = [{"key": key, "size_bytes": _size(store, key)} for key in store.list(prefix)]
    archive = {"object": "tenant.export", "tenant_id": tenant_id, "name": name, "exported_at": stamp,
               "rows": tenant_data.export_rows(session, tenant_id), "objects": objects}
    key = layout.tenant_export_key(tenant_id, stamp)
    store.put_bytes(key, json.dumps(archive, default=str, sort_keys=True).encode())
    return key


def _size(store: ObjectStore, key: str) -> int | None:
    try:
        return store.size_bytes(key)
    except (FileNotFoundError, OSError):
        return None


def purge(session: Session, store: ObjectStore, tenant_id: str, deletion: Deletion, now: float) -> None:
    """Every object under the tenant's prefix, then every row but its billing."""
    prefix = layout.tenant_prefix(tenant_id)
    deletion.objects_deleted = len(store.list(prefix))
    store.delete_prefix(prefix)
    if isinstance(store, EncryptingStore) and isinstance(store.keys, TenantKeyRing):
        # its data key erased too: copies of its objects (a backup, a replica) no longer open
        deletion.data_keys_erased = store.keys.revoke(tenant_id, session)
    deletion.rows_deleted = tenant_data.purge_rows(session, tenant_id)
    audit.platform_change(session, "tenant.purge", "tenants", tenant_id, tenant_id,
                          {"objects_deleted": deletion.objects_deleted, "purged_at": int(now)})


def finish_pending(session_factory: Any, store: ObjectStore) -> list[str]:
    """The scheduler's `tenant_purge` duty: purge each deleted tenant whose trainers have stopped
    since. `session_factory()`: a unit of work (Database.session)."""
    with session_factory() as session:
        pending = [tenant_repo.by_id(session, tenant_id) for tenant_id in tenant_data.pending_deletions(session)]
        names = [tenant.name for tenant in pending if tenant is not None]
    done = []
    for name in names:
        with session_factory() as session:
            if delete_tenant(session, store, name).status == "deleted":
                done.append(name)
    return done
