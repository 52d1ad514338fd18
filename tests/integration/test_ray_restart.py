"""Killing and restarting the control plane while a job trains on Ray loses no job and no metric.

`tuneforge serve` runs as a real process, a Ray driver with the Ray executor.
Once the trainer reports its first steps that process is SIGKILLed. The
attempt's placement group and trainer actor are detached: they outlive their
driver, and the trainer keeps training and queues its reports. A new control
plane on the same database finds the actor again by its name, the queued
reports arrive (de-duplicated by `seq`) and the job finishes in its first
attempt with every step's metrics exactly once.
"""

from __future__ import annotations

import time

import pytest

from tests.e2e.test_restart import (
    JOB_TIMEOUT_S,
    OUTAGE_S,
    STEP_LINE,
    TOTAL_STEPS,
    ServeProcess,
    create_long_job,
    held,
    metrics_steps,
    serve_env,
    trainer_pids,
)
from tests.helpers import ray_cluster
from tests.helpers.net import free_port, wait_until
from tests.helpers.platform import make_platform, tenant_with_model
from tuneforge.db.repos import attempts as attempt_repo

pytestmark = pytest.mark.ray


def test_a_control_plane_killed_and_restarted_finds_its_ray_attempt_again(
        tmp_path, database_url, tiny_model_dir, s3_storage, ray_head):
    cluster_settings = ray_cluster.plane_settings(ray_head, s3_storage, tmp_path / "nodes", namespace="tf-restart")
    key = tenant_with_model(tmp_path, database_url, tiny_model_dir, **cluster_settings)  # the store: the bucket

    port = free_port()
    env = serve_env(tmp_path / "home", database_url, port, **cluster_settings)
    plane = ServeProcess(env, port, tmp_path / "serve.log")
    plane.start()
    try:
        sdk, job = create_long_job(plane.url, key, tmp_path)

        seen = wait_until(lambda: metrics_steps(sdk, job.id), JOB_TIMEOUT_S, "the first metrics event")
        plane.kill()
        killed_at_step = max(seen)
        time.sleep(OUTAGE_S)
        with held(trainer_pids(tmp_path / "nodes")):  # mid-run when the new plane is up
            plane.start()

        [trainer_log] = (tmp_path / "nodes").glob(f"*/attempts/*{job.id}*/rank-0.log")
        logged = [int(m.group(1)) for m in STEP_LINE.finditer(trainer_log.read_text(errors="replace"))]
        assert max(logged, default=0) > killed_at_step, "the trainer did not train during the outage"
        assert max(logged) < TOTAL_STEPS, "training ended before the new control plane was up"

        done = wait_until(
            lambda: (j := sdk.fine_tuning.jobs.retrieve(job.id)).status in ("succeeded", "failed", "cancelled") and j,
            JOB_TIMEOUT_S, "the job to end", interval_s=0.3)
        assert done.status == "succeeded", done.error
        events = list(sdk.fine_tuning.jobs.list_events(job.id, limit=100))
        steps = sorted(e.data["step"] for e in events if e.type == "metrics")
        assert steps == list(range(1, TOTAL_STEPS + 1))  # every step's metrics exactly once
        assert done.attempt == 1  # found again, not relaunched
        assert not [e for e in events if (e.data or {}).get("code") == "job_restarted"]
        assert "not delivered" in trainer_log.read_text(errors="replace")  # it did report into the outage
        # the new plane released the finished attempt's placement group
        reader = make_platform(tmp_path, database_url, **cluster_settings)
        try:
            wait_until(lambda: "released_at" in attempt_handle(reader, job.organization_id, job.id), 30,
                       "the attempt's release")
        finally:
            reader.db.dispose()
    finally:
        plane.stop()


def attempt_handle(platform, tenant_id: str, job_id: str) -> dict:
    with platform.db.session() as session:
        [attempt] = attempt_repo.for_job(session, tenant_id, job_id)
        return dict(attempt.handle or {})

