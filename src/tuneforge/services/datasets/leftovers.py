"""Leftover objects: bytes in the store that no database row owns, swept after a grace period.

An upload writes its bytes first and commits its row last, so a worker that dies in between
(killed, out of memory, the host restarting) leaves a file's folder and maybe its validation
report with no row: no tenant can list or delete them, yet they count as storage. The
scheduler's housekeeping runs `LeftoverSweeper.sweep` (hourly): a file folder or report
whose file id has no row is remembered when first seen and deleted once it has stayed
orphaned for `ORPHAN_GRACE_S`, far longer than any upload takes to commit, so an upload
still in progress is never swept. What was seen is kept in memory: a new scheduler leader
starts the grace again, which only delays a deletion.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from tuneforge.db.repos import files as file_repo
from tuneforge.db.repos import tenants as tenant_repo
from tuneforge.storage import layout
from tuneforge.storage.store import ObjectStore

ORPHAN_GRACE_S = 24 * 3600  # an upload's write-then-commit takes minutes at most (its check has a deadline)
_REPORT_SUFFIX = ".json"


class LeftoverSweeper:
    """Deletes file objects without a row once they have been orphaned for `grace_s`."""

    def __init__(self, grace_s: float = ORPHAN_GRACE_S) -> None:
        self.grace_s = grace_s
        self._first_seen: dict[tuple[str, str], float] = {}  # (tenant, file id) -> when first seen orphaned

    def sweep(self, session: Session, store: ObjectStore, now: float) -> int:
        """One pass over every tenant's files; how many orphaned files were deleted."""
        still_orphaned: dict[tuple[str, str], float] = {}
        removed = 0
        for tenant in tenant_repo.list_all(session):
            tenant_id = tenant.tenant_id
            stored = stored_file_ids(store, tenant_id)
            for file_id in stored - file_repo.existing_ids(session, tenant_id, stored):
                first_seen = self._first_seen.get((tenant_id, file_id), now)
                if now - first_seen < self.grace_s:
                    still_orphaned[(tenant_id, file_id)] = first_seen
                    continue
                store.delete_prefix(layout.file_prefix(tenant_id, file_id))
                store.delete(layout.file_report_key(tenant_id, file_id))
                removed += 1
        self._first_seen = still_orphaned  # a file that got its row, or went, is forgotten
        return removed


def stored_file_ids(store: ObjectStore, tenant_id: str) -> set[str]:
    """File ids that have a folder or a validation report in the store."""
    ids: set[str] = set()
    files_prefix = layout.tenant_files_prefix(tenant_id) + "/"
    for key in store.list(files_prefix):
        if key.startswith(files_prefix):
            ids.add(key[len(files_prefix):].split("/", 1)[0])
    reports_prefix = layout.tenant_file_reports_prefix(tenant_id) + "/"
    for key in store.list(reports_prefix):
        name = key[len(reports_prefix):]
        if key.startswith(reports_prefix) and "/" not in name and name.endswith(_REPORT_SUFFIX):
            ids.add(name[: -len(_REPORT_SUFFIX)])
    return ids
