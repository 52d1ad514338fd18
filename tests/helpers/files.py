"""Uploads whose validation runs in the background (services/datasets/processing.py): an upload
answers within `upload_validate_wait_s`, and a file checked slower than that (a busy test
machine, an eval set's index built first) is still `processing`; tests that read the outcome
wait for it as a client would."""

from __future__ import annotations

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
