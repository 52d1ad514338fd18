"""Validation of uploaded fine-tune files, off the request path.

An upload stores a fine-tune file with status `processing` and hands it to this process's
`FileChecks`: at most `upload_validate_concurrency` run at once, each on a thread that waits for
`check_upload` in an isolated worker process (`data.isolation`), so neither the event loop nor a
request's thread does the work. The request itself waits at most `upload_validate_wait_s`
(`settle`): a small file answers `processed` or `error` in one call, a larger one `processing`,
and the file's `validation` field shows rows and bytes checked as the check goes on.

Crash safety is a lease on the file row. A run first claims the file (one conditional UPDATE:
nobody holds it, or its holder's heartbeat is older than `upload_validate_lease_s`), and a ticker
thread renews every claim of this process each `upload_validate_heartbeat_s`, recording the
progress the worker writes (`data.progress`). The outcome is written only while the claim is still
this process's. A process that dies stops renewing; the scheduler's `file_checks` duty
(`resume_stale`) finds the claim stale and runs the validation again, wherever the scheduler
runs. Each claim counts a run: a file whose check keeps ending its process fails with
`check_failed` after `upload_validate_max_runs`.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from tuneforge.data.example import DataIssue
from tuneforge.data.progress import read_progress
from tuneforge.data.report import DatasetReport
from tuneforge.db.repos import files as file_repo
from tuneforge.db.repos import tenants as tenant_repo
from tuneforge.db.tables import FileRow
from tuneforge.services.datasets import checks as datasets
from tuneforge.services.training import eval_sets
from tuneforge.storage import layout

if TYPE_CHECKING:
    from tuneforge.services.context import Platform

log = logging.getLogger("tuneforge.files")


@dataclass
class _Check:
    tenant_id: str
    file_id: str
    done: threading.Event = field(default_factory=threading.Event)
    claimed: bool = False
    progress_path: Path | None = None  # set while the worker runs


class FileChecks:
    """This process's validations of uploaded files: a bounded set of threads and one ticker."""

    def __init__(self, platform: Platform, owner: str | None = None) -> None:
        self._platform = platform
        self.owner = owner or f"{socket.gethostname()[:64]}:{os.getpid()}:{secrets.token_hex(4)}"
        self._lock = threading.Lock()
        self._checks: dict[str, _Check] = {}
        self._queue: deque[_Check] = deque()
        self._workers = 0
        self._ticking = False

    @property
    def concurrency(self) -> int:
        return self._platform.settings.upload_validate_concurrency

    def start(self, tenant_id: str, file_id: str) -> bool:
        """Queue the validation of a processing file; False when this process runs it already."""
        with self._lock:
            if file_id in self._checks:
                return False
            check = _Check(tenant_id, file_id)
            self._checks[file_id] = check
            self._queue.append(check)
            if self._workers < self.concurrency:
                self._workers += 1
                threading.Thread(target=self._work, name="tuneforge-file-check", daemon=True).start()
            if not self._ticking:
                self._ticking = True
                threading.Thread(target=self._tick, name="tuneforge-file-check-lease", daemon=True).start()
        return True

    def wait(self, file_id: str, timeout_s: float) -> bool:
        """Wait at most `timeout_s` for this process's validation of `file_id`; True when it ended."""
        with self._lock:
            check = self._checks.get(file_id)
        return check is None or check.done.wait(timeout_s)

    def in_flight(self) -> set[str]:
        with self._lock:
            return set(self._checks)

    # ---- the threads ---------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._workers -= 1
                    return
                check = self._queue.popleft()
            try:
                self._run(check)
            except Exception:  # noqa: BLE001 - the claim lapses and the duty runs it again
                log.exception("the validation of %s failed; it will be run again", check.file_id)
            finally:
                with self._lock:
                    self._checks.pop(check.file_id, None)
                check.done.set()

    def _run(self, check: _Check) -> None:
        platform, settings = self._platform, self._platform.settings
        now = time.time()
        with platform.db.session() as session:
            if not file_repo.claim_validation(session, check.file_id, self.owner, now,
                                              now - settings.upload_validate_lease_s):
                return  # validated meanwhile, deleted, or another process holds it
            row = file_repo.get(session, check.tenant_id, check.file_id)
            if row is None:
                return
            check.claimed = True
            key, filename, runs, size_bytes = row.key, row.filename, row.validation_runs, row.size_bytes
            tier = tenant_repo.tier_of(session, check.tenant_id) or "standard"
            contamination = eval_sets.index_for(session, platform.store, check.tenant_id)
        if runs > settings.upload_validate_max_runs:
            report = _given_up(filename, runs - 1)
            platform.store.put_bytes(layout.file_report_key(check.tenant_id, check.file_id),
                                     json.dumps(report.to_dict()).encode())
            progress: dict[str, Any] | None = {"rows_checked": 0, "bytes_checked": 0, "bytes_total": size_bytes}
        else:
            with tempfile.TemporaryDirectory(prefix="tuneforge-file-check-") as scratch:
                check.progress_path = Path(scratch) / "progress.json"
                try:
                    report = datasets.check_upload(platform.store, key, filename, check.tenant_id, check.file_id,
                                                   tier, contamination, progress_path=check.progress_path)
                    progress = read_progress(check.progress_path)
                finally:
                    check.progress_path = None
        self._record(check, report, progress)

    def _record(self, check: _Check, report: DatasetReport, progress: dict[str, Any] | None) -> None:
        platform = self._platform
        with platform.db.session() as session:
            if file_repo.finish_validation(session, check.file_id, self.owner, outcome(check.file_id, report,
                                                                                       progress)):
                return
            gone = file_repo.get(session, check.tenant_id, check.file_id) is None
        if gone:  # deleted while it was checked: its report goes too
            platform.store.delete(layout.file_report_key(check.tenant_id, check.file_id))
        else:
            log.info("the validation of %s was taken over by another process; its outcome is theirs", check.file_id)

    def _tick(self) -> None:
        """Renew this process's claims, with their progress, until none is left."""
        while True:
            time.sleep(self._platform.settings.upload_validate_heartbeat_s)
            with self._lock:
                claimed = [check for check in self._checks.values() if check.claimed]
                if not self._checks:
                    self._ticking = False
                    return
            try:
                self._renew(claimed)
            except Exception:  # noqa: BLE001 - a database hiccup: the next tick tries again
                log.warning("renewing the claims on files being validated failed", exc_info=True)

    def _renew(self, claimed: list[_Check]) -> None:
        if not claimed:
            return
        now = time.time()
        with self._platform.db.session() as session:
            for check in claimed:
                path = check.progress_path
                progress = read_progress(path) if path is not None else None
                if not file_repo.renew_validation(session, check.file_id, self.owner, now, progress):
                    check.claimed = False  # taken over or ended: its outcome will not be written by us


def outcome(file_id: str, report: DatasetReport, progress: dict[str, Any] | None) -> dict[str, Any]:
    """The file row's fields once its check has ended."""
    values: dict[str, Any] = {
        "num_examples": report.num_examples, "data_format": report.data_format, "data_kind": report.kind,
        "status": "processed" if report.ok else "error",
        "status_details": report.summary(f"GET /v1/files/{file_id}/validation") or None,
    }
    if progress is not None:
        values["validation_progress"] = progress
    return values


def _given_up(filename: str, runs: int) -> DatasetReport:
    report = DatasetReport(method="any")
    report.errors.add(DataIssue("check_failed", f"the check of {filename} was started {runs} times and its process "
                                "ended each time before it finished; the file is not used"))
    return report


# ---- what requests and the scheduler call ------------------------------------------------------

def settle(session: Session, platform: Platform, tenant_id: str, file_id: str | None) -> None:
    """After an upload stored a processing file: commit it, start its validation in this process
    and wait for it at most `upload_validate_wait_s` (this is a request's worker thread, never the
    event loop). The caller reads the file again afterwards."""
    if file_id is None:
        return
    row = file_repo.get(session, tenant_id, file_id)
    if row is None or row.status != "processing":
        return
    session.commit()  # visible to the validation's own session, and to every other process
    checks = platform.file_checks()
    checks.start(tenant_id, file_id)
    if platform.settings.upload_validate_wait_s > 0:
        checks.wait(file_id, platform.settings.upload_validate_wait_s)
    session.expire_all()


def resume_stale(platform: Platform) -> list[str]:
    """The scheduler's duty: validations whose claim was not renewed within the lease (their
    process died, or never started them) are run again here, as many as this process has room for."""
    checks = platform.file_checks()
    busy = checks.in_flight()
    room = checks.concurrency - len(busy)
    if room <= 0:
        return []
    now = time.time()
    with platform.db.session() as session:
        stale = [(row.tenant_id, row.file_id) for row in
                 file_repo.stale_validations(session, now - platform.settings.upload_validate_lease_s,
                                             room + len(busy))
                 if row.file_id not in busy]
    started = [file_id for tenant_id, file_id in stale[:room] if checks.start(tenant_id, file_id)]
    if started:
        log.info("validating again %d file(s) whose validation was lost: %s", len(started), ", ".join(started))
    return started


def progress_of(row: FileRow) -> dict[str, Any] | None:
    """The `validation` field of a File object: rows and bytes checked, and the share done."""
    progress = row.validation_progress
    if not progress:
        return None
    total = int(progress.get("bytes_total") or 0)
    checked = int(progress.get("bytes_checked") or 0)
    # the reader runs ahead of the checks by a buffer: all bytes read is not yet done
    percent = 100.0 if row.status != "processing" else (min(99.9, round(100.0 * checked / total, 1)) if total else 0.0)
    return {"rows_checked": int(progress.get("rows_checked") or 0), "bytes_checked": checked, "bytes_total": total,
            "percent": percent}
