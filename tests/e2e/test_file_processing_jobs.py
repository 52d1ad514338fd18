"""A job created on a file still being validated (docs/datasets.md, "When checks run"): accepted,
it waits in validating_files until the file is processed and then trains, or fails with the
file's error, billed nothing, when the file ends in error."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from tests.e2e.conftest import start_plane
from tests.e2e.test_lifecycle import wait_for
from tests.helpers.files import hold_upload_checks
from tests.helpers.platform import chat_lines
from tuneforge.demo.dataset import DEMO_LORA

pytestmark = pytest.mark.e2e


@pytest.fixture
def plane(tmp_path, database_url, tiny_model_dir):
    world = start_plane(tmp_path, database_url, tiny_model_dir, upload_validate_wait_s=0.0)
    yield world
    world.close()


@pytest.fixture
def held(monkeypatch):
    """Upload checks wait until the test lets them go, so that a file is processing for sure."""
    release = hold_upload_checks(monkeypatch)
    yield release
    release.set()


def _create(sdk, training_file: str):  # noqa: ANN001, ANN202
    return sdk.fine_tuning.jobs.create(
        model="tiny-chat", training_file=training_file, seed=0,
        method={"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 1, "batch_size": 8}}},
        extra_body={"training_type": {"type": "lora", **DEMO_LORA}})


def _stays_validating(sdk, job_id: str, seconds: float) -> None:  # noqa: ANN001
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:  # many scheduler ticks (0.2 s each)
        assert sdk.fine_tuning.jobs.retrieve(job_id).status == "validating_files"
        time.sleep(0.2)


def test_a_job_on_a_processing_file_waits_for_it_then_trains(plane, held):
    sdk = plane.sdk(plane.key_a)
    training = sdk.files.create(file=("train.jsonl", chat_lines(24)), purpose="fine-tune")
    assert training.status == "processing"
    job = _create(sdk, training.id)
    assert job.status == "validating_files"
    _stays_validating(sdk, job.id, 2.0)
    events = [e.message for e in sdk.fine_tuning.jobs.list_events(job.id, limit=50)]
    assert f"Waiting for the upload validation of {training.id} to finish" in events
    held.set()
    assert sdk.files.wait_for_processing(training.id, poll_interval=0.1, max_wait_seconds=60).status == "processed"
    done = wait_for(sdk, job.id)
    assert done.status == "succeeded", done.error
    assert done.trained_tokens > 0


def test_a_job_on_a_file_that_ends_in_error_fails_with_the_files_error(plane, held):
    sdk = plane.sdk(plane.key_a)
    lines = chat_lines(24).decode().splitlines()
    lines[4] = '{"messages": "not a list"}'
    training = sdk.files.create(file=("bad.jsonl", ("\n".join(lines) + "\n").encode()), purpose="fine-tune")
    assert training.status == "processing"
    job = _create(sdk, training.id)
    assert job.status == "validating_files"
    _stays_validating(sdk, job.id, 1.0)
    held.set()
    failed = sdk.files.wait_for_processing(training.id, poll_interval=0.1, max_wait_seconds=60)
    assert failed.status == "error" and failed.status_details.startswith("line 5: ")
    done = wait_for(sdk, job.id, timeout_s=60)
    assert done.status == "failed"
    assert done.error.code == "invalid_training_file" and done.error.param == "training_file"
    assert done.error.message.startswith(f"training_file {training.id} failed validation: line 5: ")
    assert done.error.message.endswith(f"(the whole report: GET /v1/files/{training.id}/validation)")
    assert done.trained_tokens in (None, 0)
    usage = httpx.get(f"{plane.url}/v1/usage", headers={"Authorization": f"Bearer {plane.key_a}"}).json()
    assert usage["data"] == [] and usage["totals"]["billable_gpu_hours"] == 0  # no attempt ran: nothing billed
    # a file already in error at create time is refused as before
    with pytest.raises(openai.BadRequestError) as refused:
        _create(sdk, training.id)
    assert refused.value.body["code"] == "invalid_file" and refused.value.body["param"] == "training_file"
