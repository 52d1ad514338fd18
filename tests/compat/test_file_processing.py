"""Uploads validated in the background (docs/datasets.md, "When checks run"): the official SDK's
`files.create` answers `processing` at once, `files.wait_for_processing` ends `processed` or
`error`, and the file's `validation` field shows the check's progress meanwhile."""

from __future__ import annotations

import hashlib
import json
import time

import httpx
import pytest

from tests.compat.conftest import start_live
from tests.helpers.files import hold_upload_checks
from tests.helpers.platform import chat_lines


@pytest.fixture
def eager(tmp_path, database_url, tiny_model_dir):
    """A live plane whose uploads never wait for their validation, renewing claims five times a second."""
    world = start_live(tmp_path, database_url, tiny_model_dir, upload_validate_wait_s=0.0,
                       upload_validate_heartbeat_s=0.2)
    yield world
    world.plane.close()


@pytest.fixture
def held(monkeypatch):
    """Upload checks wait until the test lets them go, so that a file is processing for sure."""
    release = hold_upload_checks(monkeypatch)
    yield release
    release.set()


def _validation(live, file_id: str) -> dict:
    response = httpx.get(f"{live.url}/v1/files/{file_id}", headers={"Authorization": f"Bearer {live.key_a}"})
    assert response.status_code == 200, response.text
    return response.json()


def test_a_large_upload_answers_processing_at_once_and_shows_its_progress_until_processed(eager, tmp_path):
    rows = 100_000
    data = chat_lines(rows)
    path = tmp_path / "big.jsonl"
    path.write_bytes(data)
    sdk = eager.sdk()
    started = time.monotonic()
    created = sdk.files.create(file=path.open("rb"), purpose="fine-tune")
    assert created.status == "processing"
    assert time.monotonic() - started < 5.0  # the check of 100k rows takes longer than this here
    assert created.status_details is None
    seen = []
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        body = _validation(eager, created.id)
        seen.append((body["status"], body["validation"]))
        if body["status"] != "processing":
            break
        time.sleep(0.2)
    done = sdk.files.wait_for_processing(created.id, poll_interval=0.2, max_wait_seconds=300)
    assert done.status == "processed" and done.status_details is None
    final = done.model_extra["validation"]
    assert final == {"rows_checked": rows, "bytes_checked": len(data), "bytes_total": len(data), "percent": 100.0}
    during = [progress for status, progress in seen if status == "processing"]
    assert during[0]["bytes_total"] == len(data)
    assert [p["rows_checked"] for p in during] == sorted(p["rows_checked"] for p in during)  # never goes back
    assert [p["bytes_checked"] for p in during] == sorted(p["bytes_checked"] for p in during)
    midway = [p for p in during if 0 < p["rows_checked"] < rows]
    assert midway, during  # progress was seen while the check ran, not only at its ends
    assert all(p["percent"] == min(99.9, round(100 * p["bytes_checked"] / len(data), 1)) for p in during)
    report = httpx.get(f"{eager.url}/v1/files/{created.id}/validation",
                       headers={"Authorization": f"Bearer {eager.key_a}"}).json()
    assert report["status"] == "processed" and report["num_examples"] == rows and report["ok"] is True


def test_a_bad_file_ends_in_error_with_the_line_of_its_first_error(eager, tmp_path):
    lines = chat_lines(30).decode().splitlines()
    lines[16] = '{"messages": [{"role": "user", "content": "no answer"'  # line 17: cut short
    sdk = eager.sdk()
    created = sdk.files.create(file=("bad.jsonl", ("\n".join(lines) + "\n").encode()), purpose="fine-tune")
    assert created.status in ("processing", "error")
    done = sdk.files.wait_for_processing(created.id, poll_interval=0.1, max_wait_seconds=120)
    assert done.status == "error"
    assert done.status_details.startswith("line 17: not valid JSON") and "[invalid_json]" in done.status_details
    report = httpx.get(f"{eager.url}/v1/files/{created.id}/validation",
                       headers={"Authorization": f"Bearer {eager.key_a}"}).json()
    assert report["ok"] is False and report["status"] == "error"
    assert report["errors"]["invalid_json"]["count"] == 1
    assert report["errors"]["invalid_json"]["first"][0]["line"] == 17


def test_a_held_check_keeps_the_file_processing_and_the_sdk_waits_for_it(eager, held):
    sdk = eager.sdk()
    created = sdk.files.create(file=("train.jsonl", chat_lines(40)), purpose="fine-tune")
    assert created.status == "processing"
    time.sleep(1.0)  # five heartbeats: the claim is renewed, nothing ends it
    still = sdk.files.retrieve(created.id)
    assert still.status == "processing"
    assert still.model_extra["validation"]["rows_checked"] == 0
    assert [f.status for f in sdk.files.list().data if f.id == created.id] == ["processing"]
    early = httpx.get(f"{eager.url}/v1/files/{created.id}/validation",
                      headers={"Authorization": f"Bearer {eager.key_a}"})
    assert early.status_code == 404 and early.json()["error"]["code"] == "report_not_ready"
    held.set()
    done = sdk.files.wait_for_processing(created.id, poll_interval=0.1, max_wait_seconds=120)
    assert done.status == "processed"
    assert done.model_extra["validation"]["rows_checked"] == 40


def test_the_default_wait_answers_a_small_file_processed_in_one_call(live):
    created = live.sdk().files.create(file=("small.jsonl", chat_lines(20)), purpose="fine-tune")
    assert created.status == "processed"
    assert created.model_extra["validation"]["rows_checked"] == 20


def test_a_chunked_upload_of_a_large_file_completes_processing_and_ends_processed(eager, tmp_path):
    data = chat_lines(5_000)
    path = tmp_path / "train.jsonl"
    path.write_bytes(data)
    sdk = eager.sdk()
    upload = sdk.uploads.upload_file_chunked(file=path, mime_type="application/jsonl", purpose="fine-tune",
                                             part_size=256 * 1024, md5=hashlib.md5(data).hexdigest())
    assert upload.status == "completed" and upload.file.status == "processing"
    done = sdk.files.wait_for_processing(upload.file.id, poll_interval=0.1, max_wait_seconds=120)
    assert done.status == "processed"
    assert done.model_extra["validation"]["rows_checked"] == 5_000
    assert json.loads(sdk.files.content(done.id).read().splitlines()[0])["messages"][0]["role"] == "system"
