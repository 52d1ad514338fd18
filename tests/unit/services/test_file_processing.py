"""Background validation of uploads (services/datasets/processing.py): the claim on the file row,
its renewal, and the scheduler's duty that runs again a validation whose process died."""

from __future__ import annotations

import io
import json
import threading
import time
from pathlib import Path

from tests.helpers.platform import add_tenant, chat_lines, make_platform
from tuneforge.db.repos import files as file_repo
from tuneforge.db.repos import tenants as tenant_repo
from tuneforge.db.tables import FileRow
from tuneforge.scheduler.housekeeping import Housekeeping, platform_duties
from tuneforge.services.datasets import files as file_service
from tuneforge.services.datasets import processing
from tuneforge.services.datasets.processing import FileChecks
from tuneforge.storage import layout

LEASE_S = 30.0


class _NoExecutor:
    def reap(self, active: set) -> list[str]:  # noqa: ARG002
        return []


def _platform(tmp_path: Path, database_url: str, **overrides):  # noqa: ANN202
    platform = make_platform(tmp_path, database_url, upload_validate_lease_s=LEASE_S,
                             upload_validate_heartbeat_s=0.1, **overrides)
    add_tenant(platform, "acme")
    with platform.db.session() as session:
        tenant_id = tenant_repo.by_name(session, "acme").tenant_id
    return platform, tenant_id


def _upload(platform, tenant_id: str, data: bytes) -> str:  # noqa: ANN001
    """A fine-tune file stored as an upload stores it: processing, its validation not started."""
    with platform.db.session() as session:
        row = file_service.upload(session, platform.store, tenant_id, filename="train.jsonl", purpose="fine-tune",
                                  stream=io.BytesIO(data), max_bytes=1 << 30, settings=platform.settings)
        assert row.status == "processing"
        return row.file_id


def _row(platform, file_id: str) -> FileRow:  # noqa: ANN001
    with platform.db.session() as session:
        row = session.query(FileRow).filter_by(file_id=file_id).one()
        session.expunge(row)
        return row


def _claimed_by_a_dead_process(platform, file_id: str, heartbeat_age_s: float, runs: int = 1) -> None:  # noqa: ANN001
    with platform.db.session() as session:
        row = session.query(FileRow).filter_by(file_id=file_id).one()
        row.validation_owner = "gone-host:4242:deadbeef"
        row.validation_heartbeat = time.time() - heartbeat_age_s
        row.validation_runs = runs


def _wait_ended(platform, file_id: str, timeout_s: float = 60.0) -> FileRow:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        row = _row(platform, file_id)
        if row.status != "processing":
            return row
        time.sleep(0.05)
    raise AssertionError(f"{file_id} still processing after {timeout_s} s")


def test_a_stale_claim_is_run_again_by_the_duty_and_a_fresh_one_is_left_alone(tmp_path, database_url):
    platform, tenant_id = _platform(tmp_path, database_url)
    stale = _upload(platform, tenant_id, chat_lines(25))
    fresh = _upload(platform, tenant_id, chat_lines(12))
    _claimed_by_a_dead_process(platform, stale, heartbeat_age_s=LEASE_S + 5)
    _claimed_by_a_dead_process(platform, fresh, heartbeat_age_s=LEASE_S - 10)
    try:
        keeping = Housekeeping(platform_duties(platform, _NoExecutor()))
        assert "file_checks" in keeping.run_due()
        done = _wait_ended(platform, stale)
        assert (done.status, done.num_examples, done.data_kind, done.status_details) == ("processed", 25, "chat", None)
        assert done.validation_owner is None and done.validation_runs == 2  # the dead process's run, and this one
        assert done.validation_progress["rows_checked"] == 25
        report = json.loads(platform.store.get_bytes(layout.file_report_key(tenant_id, stale)))
        assert report["num_examples"] == 25
        untouched = _row(platform, fresh)  # its holder may still be alive: within the lease
        assert (untouched.status, untouched.validation_owner) == ("processing", "gone-host:4242:deadbeef")
        assert processing.resume_stale(platform) == []
    finally:
        platform.db.dispose()


def test_the_claim_goes_to_one_process_only(tmp_path, database_url):
    platform, tenant_id = _platform(tmp_path, database_url)
    file_id = _upload(platform, tenant_id, chat_lines(10))
    _claimed_by_a_dead_process(platform, file_id, heartbeat_age_s=LEASE_S + 1)
    try:
        now = time.time()
        with platform.db.session() as first, platform.db.session() as second:
            assert file_repo.claim_validation(first, file_id, "one:1:a", now, now - LEASE_S) is True
            first.commit()
            # the other process saw the same stale row; its conditional UPDATE now finds it held
            assert file_repo.claim_validation(second, file_id, "two:2:b", now, now - LEASE_S) is False
        row = _row(platform, file_id)
        assert (row.validation_owner, row.validation_runs) == ("one:1:a", 2)
        with platform.db.session() as session:  # the loser can neither renew nor record an outcome
            assert file_repo.renew_validation(session, file_id, "two:2:b", now + 1, {"rows_checked": 3}) is False
            assert file_repo.finish_validation(session, file_id, "two:2:b", {"status": "processed"}) is False
            assert file_repo.renew_validation(session, file_id, "one:1:a", now + 1, {"rows_checked": 3}) is True
        row = _row(platform, file_id)
        assert (row.status, row.validation_heartbeat, row.validation_progress) == ("processing", now + 1,
                                                                                  {"rows_checked": 3})
    finally:
        platform.db.dispose()


def test_a_validation_taken_over_meanwhile_does_not_write_its_outcome(tmp_path, database_url, monkeypatch):
    platform, tenant_id = _platform(tmp_path, database_url)
    file_id = _upload(platform, tenant_id, chat_lines(15))
    try:
        checks = FileChecks(platform, owner="slow:1:a")
        real = processing.datasets.check_upload

        def taken_over_while_checking(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            now = time.time()  # another process finds the claim stale and takes it
            with platform.db.session() as session:
                assert file_repo.claim_validation(session, file_id, "fast:2:b", now, now + 1)
            return real(*args, **kwargs)

        monkeypatch.setattr(processing.datasets, "check_upload", taken_over_while_checking)
        assert checks.start(tenant_id, file_id) is True
        assert checks.wait(file_id, 60)
        row = _row(platform, file_id)
        assert (row.status, row.validation_owner, row.num_examples) == ("processing", "fast:2:b", None)
    finally:
        platform.db.dispose()


def test_a_file_whose_check_keeps_ending_its_process_fails_after_the_last_run(tmp_path, database_url):
    platform, tenant_id = _platform(tmp_path, database_url, upload_validate_max_runs=3)
    file_id = _upload(platform, tenant_id, chat_lines(10))
    _claimed_by_a_dead_process(platform, file_id, heartbeat_age_s=LEASE_S + 1, runs=3)
    try:
        assert processing.resume_stale(platform) == [file_id]
        row = _wait_ended(platform, file_id)
        assert row.status == "error" and row.validation_runs == 4
        assert row.status_details.startswith("the check of train.jsonl was started 3 times and its process ended")
        assert row.status_details.endswith("[check_failed]")
        report = json.loads(platform.store.get_bytes(layout.file_report_key(tenant_id, file_id)))
        assert report["ok"] is False and report["errors"]["check_failed"]["count"] == 1
    finally:
        platform.db.dispose()


def test_the_running_claim_is_renewed_with_progress_while_the_check_runs(tmp_path, database_url):
    platform, tenant_id = _platform(tmp_path, database_url)
    file_id = _upload(platform, tenant_id, chat_lines(30_000))
    try:
        checks = FileChecks(platform, owner="here:1:a")
        assert checks.start(tenant_id, file_id) is True
        assert checks.start(tenant_id, file_id) is False  # once per process
        beats: list[tuple[float, dict]] = []
        while not checks.wait(file_id, 0.1):
            row = _row(platform, file_id)
            if row.status == "processing" and row.validation_owner == "here:1:a":
                beats.append((row.validation_heartbeat, row.validation_progress))
        row = _row(platform, file_id)
        assert (row.status, row.num_examples, row.validation_owner) == ("processed", 30_000, None)
        size = row.size_bytes
        assert row.validation_progress == {"rows_checked": 30_000, "bytes_checked": size, "bytes_total": size}
        heartbeats = sorted({beat for beat, _ in beats})
        assert len(heartbeats) >= 2, beats  # renewed while it ran
        rows_seen = [progress["rows_checked"] for _, progress in beats]
        assert rows_seen == sorted(rows_seen) and any(0 < rows < 30_000 for rows in rows_seen), rows_seen
    finally:
        platform.db.dispose()


def test_two_claims_racing_in_open_transactions_give_the_file_to_the_first_to_commit(tmp_path, database_url):
    platform, tenant_id = _platform(tmp_path, database_url)
    file_id = _upload(platform, tenant_id, chat_lines(10))
    _claimed_by_a_dead_process(platform, file_id, heartbeat_age_s=LEASE_S + 1)
    outcome: dict[str, bool] = {}
    try:
        now = time.time()
        with platform.db.session() as first:
            assert file_repo.claim_validation(first, file_id, "one:1:a", now, now - LEASE_S) is True

            def second_claim() -> None:
                with platform.db.session() as second:
                    outcome["two"] = file_repo.claim_validation(second, file_id, "two:2:b", now, now - LEASE_S)

            racer = threading.Thread(target=second_claim)
            racer.start()
            racer.join(0.5)
            assert racer.is_alive()  # its UPDATE waits for the first transaction's row (or database) lock
        racer.join(30)
        assert outcome == {"two": False}  # it re-read the row the first one committed: held, not stale
        assert _row(platform, file_id).validation_owner == "one:1:a"
    finally:
        platform.db.dispose()
