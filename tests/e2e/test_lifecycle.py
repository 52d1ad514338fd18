"""The whole lifecycle through a running server, driven by the official SDK:
upload -> create -> train in a real trainer process -> download -> the
adapter has learned a mapping the base model does not know."""

from __future__ import annotations

import csv
import io
import json
import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.helpers.net import wait_until
from tuneforge.demo.dataset import DEMO_HYPERPARAMETERS, DEMO_LORA, write_demo_files
from tuneforge.demo.evaluate import load_finetuned, mapping_accuracy
from tuneforge.services.training.artifacts import extract

# Both tests on the `running` plane are marked both_executors: the ray stage runs them again on Ray,
# where that plane keeps its objects in S3 (tests/e2e/conftest.py). The S3 test below is not: on
# Ray it would be the first of them over again (the same settings, the same trainer, assertions
# that are a subset of its own), so it runs once, with the local executor.
pytestmark = pytest.mark.e2e
JOB_TIMEOUT_S = 400


def wait_for(sdk: openai.OpenAI, job_id: str, statuses=("succeeded", "failed", "cancelled"),
             timeout_s: float = JOB_TIMEOUT_S):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = sdk.fine_tuning.jobs.retrieve(job_id)
        if job.status in statuses:
            return job
        time.sleep(0.1)  # a cheap read: a job's end is seen within a scheduler tick, not half a second late
    raise AssertionError(f"{job_id} still {job.status} after {timeout_s}s")


def download(url: str, key: str, job_id: str, into: Path, step: int | None = None) -> Path:
    query = "artifact=adapter" + (f"&step={step}" if step is not None else "")
    response = httpx.get(f"{url}/v1/fine_tuning/jobs/{job_id}/download?{query}",
                         headers={"Authorization": f"Bearer {key}"}, timeout=60)
    assert response.status_code == 200, response.text
    archive = into / f"{job_id}-{step}.tar.gz"
    archive.write_bytes(response.content)
    return extract(archive, into / f"unpacked-{step}")


def create_demo_job(sdk: openai.OpenAI, tmp_path: Path, hyperparameters: dict | None = None, **overrides):
    """The demo's job (`hyperparameters` changing some of DEMO_HYPERPARAMETERS); `overrides` go to create."""
    files = write_demo_files(tmp_path / "data")
    training = sdk.files.create(file=files.training_path.open("rb"), purpose="fine-tune")
    validation = sdk.files.create(file=files.validation_path.open("rb"), purpose="fine-tune")
    job = sdk.fine_tuning.jobs.create(
        model="tiny-chat", training_file=training.id, validation_file=validation.id, suffix="codes", seed=0,
        method={"type": "supervised", "supervised": {"hyperparameters": {**DEMO_HYPERPARAMETERS,
                                                                         **(hyperparameters or {})}}},
        extra_body={"training_type": {"type": "lora", **DEMO_LORA}, "checkpointing": {"every_steps": 30}},
        **overrides,
    )
    return job, files


@pytest.mark.both_executors
def test_openai_sdk_fine_tunes_a_lora_that_learns_the_mapping(running, tmp_path):
    sdk = running.sdk(running.key_a)
    job, files = create_demo_job(sdk, tmp_path)
    done = wait_for(sdk, job.id)
    assert done.status == "succeeded", done.error
    assert done.fine_tuned_model.startswith("ft:tiny-chat:acme:codes:")
    assert done.trained_tokens > 0
    assert done.hyperparameters.n_epochs == DEMO_HYPERPARAMETERS["n_epochs"]

    events = list(sdk.fine_tuning.jobs.list_events(job.id, limit=100))
    metrics = [e for e in events if e.type == "metrics"]
    assert metrics and all("step" in e.data and "train_loss" in e.data for e in metrics)
    by_step = sorted(metrics, key=lambda e: e.data["step"])
    assert by_step[-1].data["train_loss"] < by_step[0].data["train_loss"] * 0.5
    assert any(e.message.startswith("Checkpoint created") for e in events)

    checkpoints = sdk.fine_tuning.jobs.checkpoints.list(job.id).data
    assert checkpoints and all("train_loss" in c.metrics.model_dump(exclude_none=True) for c in checkpoints)
    assert checkpoints[0].step_number >= checkpoints[-1].step_number

    results = sdk.files.content(done.result_files[0]).read().decode()
    rows = list(csv.DictReader(io.StringIO(results)))
    assert list(rows[0])[:3] == ["step", "train_loss", "train_accuracy"]
    assert len(rows) == by_step[-1].data["step"]

    assert done.fine_tuned_model in [m.id for m in sdk.models.list().data]

    adapter = download(running.url, running.key_a, job.id, tmp_path)
    assert (adapter / "adapter_config.json").is_file()
    base, tokenizer = load_finetuned(running.model_dir)
    tuned, _ = load_finetuned(running.model_dir, adapter)
    before = mapping_accuracy(base, tokenizer, files.examples)
    after = mapping_accuracy(tuned, tokenizer, files.examples)
    assert before <= 0.1
    assert after >= 0.9, f"fine-tuned accuracy {after:.2f}"

    step = checkpoints[-1].step_number
    ckpt_dir = download(running.url, running.key_a, job.id, tmp_path, step=step)
    assert (ckpt_dir / "adapter_model.safetensors").is_file()

    # another tenant sees none of it
    other = running.sdk(running.key_b)
    with pytest.raises(openai.NotFoundError):
        other.fine_tuning.jobs.retrieve(job.id)
    response = httpx.get(f"{running.url}/v1/fine_tuning/jobs/{job.id}/download?artifact=adapter",
                         headers={"Authorization": f"Bearer {running.key_b}"})
    assert response.status_code == 404
    assert done.fine_tuned_model not in [m.id for m in other.models.list().data]

    # the event stream replays every event, then ends
    with httpx.stream("GET", f"{running.url}/v1/fine_tuning/jobs/{job.id}/events?stream=true",
                      headers={"Authorization": f"Bearer {running.key_a}"}, timeout=30) as stream:
        lines = [line for line in stream.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    streamed = [json.loads(line[6:]) for line in lines[:-1]]
    assert len(streamed) == len(events)
    assert streamed[-1]["data"]["status"] == "succeeded"


@pytest.mark.both_executors
def test_cancel_stops_a_running_trainer(running, tmp_path):
    sdk = running.sdk(running.key_a)
    job, _ = create_demo_job(sdk, tmp_path)
    wait_for(sdk, job.id, statuses=("running",), timeout_s=60)
    cancelled = sdk.fine_tuning.jobs.cancel(job.id)
    assert cancelled.status == "cancelled"
    from tuneforge.db.repos import attempts

    def attempt_states() -> list[str]:
        with running.plane.platform.db.session() as session:
            return [a.status for a in attempts.for_job(session, job.organization_id, job.id)]

    # the scheduler stops the trainer on its next pass (a Ray actor may still be starting)
    wait_until(lambda: attempt_states() == ["cancelled"], 60, "the attempt to end cancelled")
    assert attempt_states() == ["cancelled"]
    assert sdk.fine_tuning.jobs.retrieve(job.id).status == "cancelled"


# Its database work is that of any job, which test_openai_sdk_fine_tunes_a_lora_that_learns_the_mapping
# does on PostgreSQL (in the ray stage, or in the postgres stage when the ray stage is not run).
@pytest.mark.sqlite_pass_only
def test_lifecycle_with_the_s3_object_store(tmp_path, database_url, tiny_model_dir, s3_storage):
    """Control plane and trainer share nothing but S3 (moto on 127.0.0.1). What it checks is where
    things are written and that they come back, not what the model learns: 14 epochs of 3 steps
    rather than the demo's 50 (150 steps) still write a checkpoint at step 30 (every_steps) and at
    the last three epochs' ends (36, 39, 42), delete the one at step 30 on S3 (retention: epoch
    ends), and save the adapter."""
    from tests.e2e.conftest import start_plane

    endpoint = s3_storage.options["client_kwargs"]["endpoint_url"]
    world = start_plane(tmp_path, database_url, tiny_model_dir, storage_url=s3_storage.url,
                        s3_endpoint_url=endpoint, s3_region="us-east-1",
                        s3_access_key_id="testing", s3_secret_access_key="testing")
    try:
        sdk = world.sdk(world.key_a)
        job, _files = create_demo_job(sdk, tmp_path, hyperparameters={"n_epochs": 14})
        done = wait_for(sdk, job.id)
        assert done.status == "succeeded", done.error
        keys = world.plane.platform.store.list(f"tenants/{done.organization_id}/jobs/{job.id}")
        assert any(k.endswith("artifacts/adapter/adapter_model.safetensors") for k in keys)
        assert any("/checkpoints/step-" in k and k.endswith("manifest.json") for k in keys)
        adapter = download(world.url, world.key_a, job.id, tmp_path)
        assert (adapter / "adapter_model.safetensors").stat().st_size > 0
    finally:
        world.close()
