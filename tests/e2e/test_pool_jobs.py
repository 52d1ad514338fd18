"""Small ordinary jobs as clients of their base model's shared co-training worker: the job API,
events, checkpoints, exact resume after a preemption, the artifacts, the eval and metering as any
job has them, with one base in memory for all of them and no GPU of their own."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.e2e.test_lifecycle import wait_for

pytestmark = pytest.mark.sqlite_pass_only  # its database work is the same as any job's (covered on both backends)

BASE = "tiny-chat"


@pytest.fixture
def pooled(tmp_path, database_url, tiny_model_dir):
    """A plane (one GPU slot) that runs supervised LoRA jobs up to rank 16 on the shared pool."""
    from tests.e2e.conftest import start_plane

    world = start_plane(tmp_path / "pooled", database_url, tiny_model_dir, pool_jobs_max_rank=16,
                        pool_jobs_max_steps=200)
    yield world
    world.close()


def _submit(world, key: str, path, *, epochs: int, every_steps: int = 0, eval_on: bool = False,
            validation=None) -> str:
    sdk = world.sdk(key)
    upload = sdk.files.create(file=path.open("rb"), purpose="fine-tune")
    body = {"model": BASE, "training_file": upload.id, "seed": 7, "method": {
        "type": "supervised", "supervised": {"hyperparameters": {
            "n_epochs": epochs, "batch_size": 4, "learning_rate": 1e-2, "learning_rate_multiplier": 1.0,
            "warmup_ratio": 0.0, "lr_scheduler_type": "linear"}}},
        "training_type": {"type": "lora", "rank": 8, "alpha": 16, "dropout": 0.0, "target_modules": "all-linear"},
        "eval": {"enabled": eval_on, "golden": False, "safety": False}}
    if validation is not None:
        body["validation_file"] = sdk.files.create(file=validation.open("rb"), purpose="fine-tune").id
    if every_steps:
        body["checkpointing"] = {"every_steps": every_steps}
    response = httpx.post(f"{world.url}/v1/fine_tuning/jobs", json=body,
                          headers={"Authorization": f"Bearer {key}"}, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()["id"]


def _attempts(world, job_id: str) -> list:
    from tuneforge.db.tables import Attempt

    with world.plane.platform.db.session() as session:
        return [(a.number, a.gpus, a.status, dict(a.handle or {})) for a in
                session.query(Attempt).filter(Attempt.job_id == job_id).order_by(Attempt.number)]


def _losses(world, key: str, job_id: str) -> dict[int, float]:
    events = world.sdk(key).fine_tuning.jobs.list_events(job_id, limit=100)  # every page
    return {e.data["step"]: e.data["train_loss"] for e in events if e.type == "metrics"}


@pytest.mark.both_executors  # its attempts are launched, stopped and started again by either executor
def test_small_jobs_train_on_the_shared_worker_resume_exactly_and_are_metered(pooled, tmp_path) -> None:
    from tests.e2e.test_training_api import _pool_attempts
    from tuneforge.demo.dataset import chat_example, demo_facts, write_jsonl

    world = pooled
    data = write_jsonl(tmp_path / "facts.jsonl", [chat_example(fact) for fact in demo_facts(12)])
    preempted = _submit(world, world.key_a, data, epochs=8, every_steps=100)
    twin = _submit(world, world.key_b, data, epochs=8)  # same data and seed, another tenant, never stopped
    sdk_a = world.sdk(world.key_a)

    # the first job's attempt is stopped as the scheduler stops any (SIGTERM through its executor)
    deadline = time.monotonic() + 180
    while len(_losses(world, world.key_a, preempted)) < 6:
        assert time.monotonic() < deadline, "the pooled job made no progress"
        time.sleep(0.2)
    (number, gpus, _status, handle), = [a for a in _attempts(world, preempted) if a[2] in ("starting", "running")]
    assert gpus == 0  # it holds no GPU slot: the worker does, one for both jobs
    world.plane.executor.signal(handle, "preempt")

    done = wait_for(sdk_a, preempted), wait_for(world.sdk(world.key_b), twin)
    assert [job.status for job in done] == ["succeeded", "succeeded"], [job.error for job in done]
    attempts = _attempts(world, preempted)
    assert len(attempts) == 2 and all(gpus == 0 for _n, gpus, _s, _h in attempts)
    assert len({attempt[0] for attempt in _pool_attempts(world)} | {1}) >= 1  # (the worker may have gone idle)

    events = [e.message for e in sdk_a.fine_tuning.jobs.list_events(preempted, limit=100)]
    assert any("shared co-training worker" in message for message in events)
    resumed = [m for m in events if m.startswith("resumed from the checkpoint at step")]
    assert len(resumed) == 1
    # every step of the stopped-and-resumed job equals its uninterrupted twin's: exact resume, and a
    # model is not changed by the other models of its cycles
    mine, theirs = _losses(world, world.key_a, preempted), _losses(world, world.key_b, twin)
    last = max(theirs)
    assert sorted(mine) == sorted(theirs) == list(range(1, last + 1)) and last >= 16
    assert [mine[s] for s in sorted(mine)] == pytest.approx([theirs[s] for s in sorted(theirs)], rel=1e-4)
    assert theirs[last] < 0.25 * theirs[1]  # it learned

    # its checkpoints and adapter are a job's: listed, downloadable
    checkpoints = sdk_a.fine_tuning.jobs.checkpoints.list(preempted).data
    assert checkpoints and max(c.step_number for c in checkpoints) == last
    response = httpx.get(f"{world.url}/v1/fine_tuning/jobs/{preempted}/download?artifact=adapter",
                         headers={"Authorization": f"Bearer {world.key_a}"}, timeout=60)
    assert response.status_code == 200 and len(response.content) > 1000

    # metered per job: its trained tokens and its share of the worker, to its own tenant only
    def pooled_tokens(key: str) -> dict[str, int]:
        rows = httpx.get(f"{world.url}/v1/usage", headers={"Authorization": f"Bearer {key}"}).json()["tokens"]
        assert all(row["device_seconds"] > 0 for row in rows if row["kind"] == "training.train")
        return {row["job_id"]: row["prompt_tokens"] for row in rows if row["kind"] == "training.train"}

    a_tokens, b_tokens = pooled_tokens(world.key_a), pooled_tokens(world.key_b)
    # the pool's job routes take only the current attempt's job token, and only for its own job
    for job_id, token in ((twin, "not-a-token"), ("ftjob-unknown", "x")):
        refused = httpx.post(f"{world.url}/internal/v1/pools/jobs/{job_id}/open", json={},
                             headers={"Authorization": f"Bearer {token}"})
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_job_token"
    assert set(a_tokens) == {preempted} and set(b_tokens) == {twin}
    assert a_tokens[preempted] == b_tokens[twin] > 0  # (the stopped job's steps are billed once each)


def test_a_pooled_jobs_adapter_is_what_the_worker_trained_and_is_evaluated_and_registered_as_any(
        pooled, tmp_path) -> None:
    from tuneforge.demo.dataset import chat_example, demo_facts, write_jsonl

    world = pooled
    facts = demo_facts(14)
    train = write_jsonl(tmp_path / "train.jsonl", [chat_example(fact) for fact in facts[:10]])
    valid = write_jsonl(tmp_path / "valid.jsonl", [chat_example(fact) for fact in facts[10:]])
    job_id = _submit(world, world.key_a, train, epochs=4, eval_on=True, validation=valid)
    job = wait_for(world.sdk(world.key_a), job_id)
    assert job.status == "succeeded", job.error
    assert [gpus for _n, gpus, _s, _h in _attempts(world, job_id)] == [0]
    events = list(world.sdk(world.key_a).fine_tuning.jobs.list_events(job_id, limit=100))
    pool_valid = {e.data["step"]: e.data["valid_loss"] for e in events
                  if e.type == "metrics" and e.data.get("valid_loss") is not None}
    assert max(pool_valid) == max(e.data["step"] for e in events if e.type == "metrics")  # measured on the
    # worker (forward only) at the last step
    # the eval loads the base with the adapter the worker trained, here: the validation loss it
    # measures is the worker's own figure for the same weights and rows
    results = job.model_extra["eval_results"]
    assert results["fine_tuned"]["validation.loss"] == pytest.approx(pool_valid[max(pool_valid)], rel=1e-3)
    assert results["base"]["validation.loss"] > results["fine_tuned"]["validation.loss"]
    assert job.fine_tuned_model and job.fine_tuned_model.startswith("ft:")
