"""Uploads whose validation runs in the background (services/datasets/processing.py): an upload
answers within `upload_validate_wait_s`, and a file checked slower than that (a busy test
machine, an eval set's index built first) is still `processing`; tests that read the outcome
wait for it as a client would."""

from __future__ import annotations

import threading
import time
from typing import Any

import openai

WAIT_S = 120.0


def processed(sdk: openai.OpenAI, file_id: str, timeout_s: float = WAIT_S) -> Any:
    """The File object once its validation has ended (`processed` or `error`), through the SDK's
    own `files.wait_for_processing`."""
    return sdk.files.wait_for_processing(file_id, poll_interval=0.05, max_wait_seconds=timeout_s)


def upload_processed(sdk: openai.OpenAI, name: str, data: bytes, purpose: str = "fine-tune") -> Any:
    """Upload `data` as `name`; the File object once validated."""
    created = sdk.files.create(file=(name, data), purpose=purpose)
    return processed(sdk, created.id) if created.status == "processing" else created


def processed_over_http(http: Any, headers: dict[str, str], file: dict[str, Any],
                        timeout_s: float = WAIT_S) -> dict[str, Any]:
    """`processed` for a test that talks plain HTTP (an httpx client or Starlette's TestClient):
    the File object once its status is no longer `processing`."""
    deadline = time.monotonic() + timeout_s
    while file["status"] == "processing":
        assert time.monotonic() < deadline, f"{file['id']} still processing after {timeout_s} s"
        time.sleep(0.05)
        answer = http.get(f"/v1/files/{file['id']}", headers=headers)
        assert answer.status_code == 200, answer.text
        file = answer.json()
    return file


def hold_upload_checks(monkeypatch: Any, timeout_s: float = WAIT_S) -> threading.Event:
    """Upload checks of this process wait until the returned event is set, so that a test knows a
    file is still `processing` (the control planes tests start run in the test's own process)."""
    from tuneforge.services.datasets import checks as datasets

    release = threading.Event()
    real = datasets.check_upload

    def held_check(*args: Any, **kwargs: Any) -> Any:
        assert release.wait(timeout_s), "the test never released the upload check"
        return real(*args, **kwargs)

    monkeypatch.setattr(datasets, "check_upload", held_check)
    return release
