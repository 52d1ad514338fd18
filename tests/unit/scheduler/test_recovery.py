"""Recovery decisions of the scheduler: backoff, out-of-memory retries, pause/resume, cancel cleanup, classes."""

from __future__ import annotations

import time

from tests.unit.scheduler.test_loop import _report, setup  # noqa: F401 - the fixture
from tuneforge.db.repos import jobs as job_repo
from tuneforge.domain.exit_codes import TrainerExit
from tuneforge.executors.protocol import PollResult
from tuneforge.storage import layout


def _attempts(http, auth, job_id):
    return http.get(f"/v1/fine_tuning/jobs/{job_id}/attempts", headers=auth).json()["data"]


def test_platform_failures_wait_with_growing_backoff(setup):  # noqa: F811
    platform, http, scheduler, executor, create_job, job, auth = setup
    platform.settings.retry_backoff_s = 30.0
    job_id = create_job()
    scheduler.tick()
    executor.states[1] = PollResult("exited", 1)  # a crash
    scheduler.tick()
    assert job(job_id)["status"] == "queued" and len(executor.launched) == 1  # waiting out the backoff
    with platform.db.session() as session:
        waited = job_repo.get_for_update(session, job_id).not_before - time.time()
    assert 25 < waited <= 30
    with platform.db.session() as session:
        job_repo.get_for_update(session, job_id).not_before = time.time() - 1
    scheduler.tick()
    assert job(job_id)["status"] == "running" and job(job_id)["attempt"] == 2
    executor.states[2] = PollResult("exited", 1)
    scheduler.tick()
    with platform.db.session() as session:
        waited = job_repo.get_for_update(session, job_id).not_before - time.time()
    assert 55 < waited <= 60  # doubled
    assert [a["failure_class"] for a in _attempts(http, auth, job_id)] == ["platform", "platform"]


def test_out_of_memory_halves_the_micro_batch_then_fails_with_advice(setup):  # noqa: F811
    _platform, http, scheduler, executor, create_job, job, auth = setup
    job_id = create_job(method={"type": "supervised", "supervised": {"hyperparameters": {
        "batch_size": 4, "gradient_accumulation_steps": 1}}})
    scheduler.tick()
    seen = []
    for pid in (1, 2, 3):
        spec = executor.launched[pid - 1]
        seen.append((spec.hyperparameters.micro_batch_size, spec.hyperparameters.gradient_accumulation_steps,
                     spec.hyperparameters.batch_size))
        executor.states[pid] = PollResult("exited", int(TrainerExit.OUT_OF_MEMORY))
        scheduler.tick()
    assert seen == [(4, 1, 4), (2, 2, 4), (1, 4, 4)]  # same effective batch every time
    failed = job(job_id)
    assert failed["status"] == "failed" and failed["error"]["code"] == "out_of_memory"
    assert "max_seq_length" in failed["error"]["message"]
    assert [a["failure_class"] for a in _attempts(http, auth, job_id)] == ["out_of_memory"] * 3


def test_pause_checkpoints_and_resume_continues(setup):  # noqa: F811
    _platform, http, scheduler, executor, create_job, job, auth = setup
    job_id = create_job()
    scheduler.tick()
    paused = http.post(f"/v1/fine_tuning/jobs/{job_id}/pause", headers=auth)
    assert paused.status_code == 200 and paused.json()["status"] == "pausing"  # stopping
    assert paused.json()["precise_status"] == "running"
    scheduler.tick()
    scheduler.tick()
    assert executor.signals == [(1, "preempt")]  # once
    executor.states[1] = PollResult("exited", int(TrainerExit.PREEMPTED))
    scheduler.tick()
    assert job(job_id)["status"] == "paused"
    assert len(executor.launched) == 1  # a paused job is not admitted
    again = http.post(f"/v1/fine_tuning/jobs/{job_id}/resume", headers=auth)
    assert again.status_code == 200 and again.json()["status"] == "queued"
    scheduler.tick()
    assert job(job_id)["status"] == "running" and job(job_id)["attempt"] == 2
    assert [a["failure_class"] for a in _attempts(http, auth, job_id)] == ["preempted", None]
    wrong = http.post(f"/v1/fine_tuning/jobs/{job_id}/resume", headers=auth)
    assert wrong.status_code == 400 and wrong.json()["error"]["code"] == "job_not_resumable"


def test_a_queued_job_pauses_at_once_and_a_finished_one_cannot(setup):  # noqa: F811
    _platform, http, scheduler, _executor, create_job, job, auth = setup
    first, second = create_job(), create_job()
    scheduler.tick()  # one slot: the second waits
    assert http.post(f"/v1/fine_tuning/jobs/{second}/pause", headers=auth).json()["status"] == "paused"
    http.post(f"/v1/fine_tuning/jobs/{first}/cancel", headers=auth)
    refused = http.post(f"/v1/fine_tuning/jobs/{first}/pause", headers=auth)
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "job_not_pausable"


def test_cancel_removes_checkpoints_unless_the_policy_keeps_them(setup):  # noqa: F811
    platform, http, scheduler, executor, create_job, job, auth = setup
    dropped = create_job()
    kept = create_job(checkpointing={"every_steps": 2, "keep_on_cancel": True})
    platform_store = platform.store
    for job_id in (dropped, kept):
        scheduler.tick()
        spec = executor.launched[-1]
        prefix = layout.checkpoint_prefix(spec.tenant_id, job_id, 2)
        platform_store.put_bytes(f"{prefix}/manifest.json", b"{}")
        assert _report(http, spec, "checkpoints", {"seq": 1, "step": 2, "prefix": prefix, "metrics": {}}
                       ).status_code == 200
        http.post(f"/v1/fine_tuning/jobs/{job_id}/cancel", headers=auth)
        scheduler.tick()
        assert job(job_id)["status"] == "cancelled"
    checkpoints = {job_id: http.get(f"/v1/fine_tuning/jobs/{job_id}/checkpoints", headers=auth).json()["data"]
                   for job_id in (dropped, kept)}
    assert checkpoints[dropped] == [] and len(checkpoints[kept]) == 1
    assert platform_store.list(layout.checkpoints_prefix(executor.launched[0].tenant_id, dropped)) == []
    assert platform_store.list(layout.checkpoints_prefix(executor.launched[0].tenant_id, kept)) != []
