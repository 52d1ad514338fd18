"""Pause and resume through the official SDK with the real trainer: no step lost, none repeated."""

from __future__ import annotations

import time

import pytest

from tests.e2e.test_lifecycle import create_demo_job, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.both_executors]


def test_pause_then_resume_with_the_sdk_continues_where_it_stopped(running, tmp_path):
    sdk = running.sdk(running.key_a)
    job, _files = create_demo_job(sdk, tmp_path)
    wait_for(sdk, job.id, statuses=("running",), timeout_s=60)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # some steps done
        if any(e.type == "metrics" for e in sdk.fine_tuning.jobs.list_events(job.id, limit=5)):
            break
        time.sleep(0.2)
    sdk.fine_tuning.jobs.pause(job.id)
    paused = wait_for(sdk, job.id, statuses=("paused", "succeeded"), timeout_s=90)
    assert paused.status == "paused", "the job finished before the pause arrived"
    time.sleep(1.0)
    assert sdk.fine_tuning.jobs.retrieve(job.id).status == "paused"  # nothing restarts a paused job

    resumed = sdk.fine_tuning.jobs.resume(job.id)
    assert resumed.status in ("queued", "running")
    done = wait_for(sdk, job.id, timeout_s=180)
    assert done.status == "succeeded", done.error
    assert done.model_extra["attempt"] == 2

    steps = [e.data["step"] for e in sdk.fine_tuning.jobs.list_events(job.id, limit=100) if e.type == "metrics"]
    total = max(steps)
    assert sorted(steps) == list(range(1, total + 1))  # every step once: nothing lost, nothing redone
    messages = [e.message for e in sdk.fine_tuning.jobs.list_events(job.id, limit=100)]
    assert any(m.startswith("Fine-tuning job paused after a checkpoint") for m in messages)
    assert any(m.startswith("resumed from the checkpoint at step") for m in messages)
