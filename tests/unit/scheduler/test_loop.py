"""The scheduler loop with a stand-in executor and a stand-in trainer that
reports over the real internal HTTP API."""

from __future__ import annotations

import io
import time

import pytest
from fastapi.testclient import TestClient

from tests.helpers.platform import add_base_model, add_tenant, chat_lines, make_platform
from tuneforge.api.app import create_app
from tuneforge.db.repos import attempts as attempt_repo
from tuneforge.db.repos import jobs as job_repo
from tuneforge.domain.exit_codes import TrainerExit
from tuneforge.executors.protocol import Capacity, NodeCapacity, PollResult
from tuneforge.scheduler.loop import Scheduler


class FakeExecutor:
    def __init__(self, gpus: int = 1) -> None:
        self.gpus = gpus
        self.launched = []  # specs
        self.states: dict[int, PollResult] = {}
        self.signals: list[tuple[int, str]] = []
        self.released: list[int] = []
        self.prepared = 0

    def prepare(self) -> None:
        self.prepared += 1

    def capacity(self) -> Capacity:
        return Capacity([NodeCapacity("fake", self.gpus, self.gpus)])

    def launch(self, spec, placement):
        self.launched.append(spec)
        pid = len(self.launched)
        self.states[pid] = PollResult("running")
        return {"pid": pid}

    def poll(self, handle):
        return self.states[handle["pid"]]

    def signal(self, handle, action):
        self.signals.append((handle["pid"], action))

    def log_tail(self, handle, max_bytes=4000):
        return "fake log"

    def release(self, handle):
        self.released.append(handle["pid"])

    def reap(self, active):
        return []

    def close(self):
        pass


def attempt_of(session, job_id: str, number: int):
    """Attempt `number` of the job, read as the job's tenant (the repository reads a job's
    attempts only together with its tenant)."""
    return attempt_repo.current(session, job_repo.get_for_update(session, job_id).tenant_id, job_id, number)


@pytest.fixture
def setup(tmp_path, database_url, tiny_model_dir):
    platform = make_platform(tmp_path, database_url, lease_timeout_s=5.0, retry_backoff_s=0.0)
    add_base_model(platform, "tiny-base", tiny_model_dir)
    key = add_tenant(platform, "alpha")
    http = TestClient(create_app(platform=platform))
    auth = {"Authorization": f"Bearer {key}"}
    file_id = http.post("/v1/files", files={"file": ("t.jsonl", io.BytesIO(chat_lines(20)))},
                        data={"purpose": "fine-tune"}, headers=auth).json()["id"]
    executor = FakeExecutor(gpus=1)
    scheduler = Scheduler(platform, executor)

    def create_job(**extra):
        body = {"model": "tiny-base", "training_file": file_id, **extra}
        response = http.post("/v1/fine_tuning/jobs", json=body, headers=auth)
        assert response.status_code == 200, response.text
        return response.json()["id"]

    def job(job_id):
        return http.get(f"/v1/fine_tuning/jobs/{job_id}", headers=auth).json()

    yield platform, http, scheduler, executor, create_job, job, auth
    http.close()
    platform.db.dispose()


def _report(http, spec, kind, body):
    return http.post(f"/internal/v1/jobs/{spec.job_id}/{kind}", json={"attempt": spec.attempt, **body},
                     headers={"Authorization": f"Bearer {spec.job_token}"})


def test_jobs_validate_then_start_in_order_within_capacity(setup):
    _platform, _http, scheduler, executor, create_job, job, _auth = setup
    first, second = create_job(), create_job()
    scheduler.tick()
    assert job(first)["status"] == "running" and job(second)["status"] == "queued"
    resolved = job(first)["method"]["supervised"]["hyperparameters"]
    assert resolved["n_epochs"] == 5  # 20 examples: auto epochs reach >= 100 examples seen
    assert resolved["learning_rate"] == pytest.approx(2e-4)
    assert job(first)["attempt"] == 1
    assert [s.job_id for s in executor.launched] == [first]
    spec = executor.launched[0]
    hyperparameters = spec.hyperparameters
    assert hyperparameters.batch_size == hyperparameters.micro_batch_size * hyperparameters.gradient_accumulation_steps


def test_reports_drive_the_job_to_success(setup):
    platform, http, scheduler, executor, create_job, job, auth = setup
    job_id = create_job(suffix="demo")
    scheduler.tick()
    spec = executor.launched[0]
    assert _report(http, spec, "heartbeat", {"step": 1, "total_steps": 10}).json() == {"action": "continue"}
    metrics = {"seq": 1, "type": "metrics", "level": "info", "message": "step 1",
               "data": {"step": 1, "train_loss": 2.5, "total_steps": 10}}
    from tuneforge import prometheus

    steps_before = prometheus.TRAINER_STEPS._value.get()
    assert _report(http, spec, "events", {"events": [metrics]}).json() == {"applied": 1}
    assert _report(http, spec, "events", {"events": [metrics]}).json() == {"applied": 0}  # retried: applied once
    assert prometheus.TRAINER_STEPS._value.get() - steps_before == 1  # counted once, for /metrics
    prefix = f"tenants/{spec.tenant_id}/jobs/{job_id}/checkpoints/step-5"
    assert _report(http, spec, "checkpoints", {"seq": 2, "step": 5, "prefix": prefix,
                                               "metrics": {"train_loss": 1.5}}).status_code == 200
    adapter = f"tenants/{spec.tenant_id}/jobs/{job_id}/artifacts/adapter"
    platform.store.put_bytes(f"tenants/{spec.tenant_id}/jobs/{job_id}/results.csv", b"step,train_loss\n1,2.5\n")
    results_key = f"tenants/{spec.tenant_id}/jobs/{job_id}/results.csv"
    assert _report(http, spec, "result", {"seq": 3, "trained_tokens": 1234, "adapter_prefix": adapter,
                                          "results_key": results_key}).status_code == 200
    done = job(job_id)
    assert done["status"] == "succeeded"
    assert done["trained_tokens"] == 1234
    assert done["fine_tuned_model"].startswith("ft:tiny-base:alpha:demo:")
    results = http.get(f"/v1/files/{done['result_files'][0]}/content", headers=auth)
    assert results.content == b"step,train_loss\n1,2.5\n"
    checkpoints = http.get(f"/v1/fine_tuning/jobs/{job_id}/checkpoints", headers=auth).json()["data"]
    assert checkpoints[0]["step_number"] == 5 and checkpoints[0]["metrics"]["train_loss"] == 1.5
    events = http.get(f"/v1/fine_tuning/jobs/{job_id}/events?limit=100", headers=auth).json()["data"]
    assert any(e["type"] == "metrics" and e["data"]["train_loss"] == 2.5 for e in events)
    models = [m["id"] for m in http.get("/v1/models", headers=auth).json()["data"]]
    assert done["fine_tuned_model"] in models
    # a retried result after success is acknowledged without effect
    assert _report(http, spec, "result", {"seq": 3, "trained_tokens": 1, "adapter_prefix": adapter}).status_code == 200
    assert job(job_id)["trained_tokens"] == 1234


def test_preempted_attempt_requeues_and_stale_attempt_is_fenced(setup):
    _platform, http, scheduler, executor, create_job, job, auth = setup
    job_id = create_job()
    scheduler.tick()
    old = executor.launched[0]
    executor.states[1] = PollResult("exited", int(TrainerExit.PREEMPTED))
    scheduler.tick()  # reconcile: requeue; admit: attempt 2
    assert job(job_id)["attempt"] == 2 and job(job_id)["status"] == "running"
    events = http.get(f"/v1/fine_tuning/jobs/{job_id}/events?limit=100", headers=auth).json()["data"]
    assert any(e["data"].get("code") == "job_restarted" for e in events)
    stale = _report(http, old, "heartbeat", {"step": 3})
    assert stale.status_code == 409 and stale.json()["error"]["code"] == "stale_attempt"
    new = executor.launched[1]
    assert _report(http, new, "heartbeat", {"step": 3}).status_code == 200
    forged = http.post(f"/internal/v1/jobs/{job_id}/heartbeat", json={"attempt": 2},
                       headers={"Authorization": f"Bearer {old.job_token}"})
    assert forged.status_code == 401


def test_lost_lease_requeues_and_repeated_crashes_fail_the_job(setup):
    platform, _http, scheduler, executor, create_job, job, _auth = setup
    job_id = create_job()
    scheduler.tick()
    with platform.db.session() as session:
        attempt = attempt_of(session, job_id, 1)
        attempt.heartbeat_at = time.time() - 60  # it had heartbeated, then went silent
        attempt.status = "running"
    scheduler.tick()
    assert (1, "cancel") in executor.signals
    assert job(job_id)["attempt"] == 2 and job(job_id)["status"] == "running"
    for pid in (2, 3):
        executor.states[pid] = PollResult("exited", 1)
        scheduler.tick()
    failed = job(job_id)
    assert failed["status"] == "failed"
    assert failed["error"]["code"] == "platform_error"


def test_cancel_signals_the_running_attempt(setup):
    _platform, http, scheduler, executor, create_job, job, auth = setup
    job_id = create_job()
    scheduler.tick()
    http.post(f"/v1/fine_tuning/jobs/{job_id}/cancel", headers=auth)
    spec = executor.launched[0]
    assert _report(http, spec, "heartbeat", {"step": 2}).json() == {"action": "stop"}
    scheduler.tick()
    assert executor.signals == [(1, "cancel")]
    assert job(job_id)["status"] == "cancelled"


def test_a_trainer_still_starting_gets_the_start_timeout_not_the_lease(setup):
    platform, _http, scheduler, executor, create_job, job, _auth = setup
    job_id = create_job()
    scheduler.tick()
    with platform.db.session() as session:
        attempt_of(session, job_id, 1).heartbeat_at = time.time() - 60  # launched 60 s ago, no heartbeat
    scheduler.tick()
    assert executor.signals == [] and job(job_id)["attempt"] == 1
    with platform.db.session() as session:
        attempt_of(session, job_id, 1).heartbeat_at = time.time() - platform.settings.start_timeout_s - 1
    scheduler.tick()
    assert (1, "cancel") in executor.signals and job(job_id)["attempt"] == 2


def test_a_resumed_attempt_recovers_the_metrics_its_predecessor_never_delivered(setup):
    """Attempt 1 trained steps 1-6 and checkpointed at 6, but only steps 1-2 and 5 reached
    the control plane before it died; attempt 2 says it resumed from step 6: the
    checkpoint's history fills in steps 3, 4 and 6 once, and the checkpoint is listed."""
    import json

    platform, http, scheduler, executor, create_job, job, auth = setup
    job_id = create_job()
    scheduler.tick()
    first = executor.launched[0]
    delivered = [{"seq": i, "type": "metrics", "level": "info", "message": f"step {step}",
                  "data": {"step": step, "total_steps": 10, "train_loss": 3.0 - step / 10}}
                 for i, step in enumerate([1, 2, 5], start=1)]
    assert _report(http, first, "events", {"events": delivered}).json() == {"applied": 3}
    prefix = f"tenants/{first.tenant_id}/jobs/{job_id}/checkpoints/step-6"
    history = [{"step": s, "train_loss": 3.0 - s / 10, "train_accuracy": 0.1 * s, "valid_loss": None,
                "valid_mean_token_accuracy": None, "learning_rate": 1e-4, "grad_norm": 0.5,
                "tokens_per_second": 100.0} for s in range(1, 8)]  # step 7 is past the checkpoint
    platform.store.put_bytes(f"{prefix}/trainer_state.json", json.dumps({"step": 6, "history": history}).encode())
    with platform.db.session() as session:  # then it went silent: SIGKILLed
        attempt = attempt_of(session, job_id, 1)
        attempt.heartbeat_at = time.time() - 60
        attempt.status = "running"
    scheduler.tick()
    second = executor.launched[1]
    assert second.attempt == 2
    body = {"seq": 1, "step": 6, "prefix": prefix, "total_steps": 10}
    assert _report(http, second, "resumed", body).json() == {"recovered_steps": 3}
    assert _report(http, second, "resumed", body).json() == {"recovered_steps": 0}  # retried: applied once
    foreign = {**body, "seq": 2, "prefix": "tenants/other/jobs/x/checkpoints/step-6"}
    answer = _report(http, second, "resumed", foreign)
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "prefix"

    events = http.get(f"/v1/fine_tuning/jobs/{job_id}/events?limit=100", headers=auth).json()["data"]
    metrics = {e["data"]["step"]: e["data"] for e in events if e["type"] == "metrics"}
    assert sorted(metrics) == [1, 2, 3, 4, 5, 6]
    assert [e["data"]["step"] for e in events if e["type"] == "metrics"].count(5) == 1
    assert metrics[4]["train_loss"] == pytest.approx(2.6)
    assert metrics[4]["train_mean_token_accuracy"] == pytest.approx(0.4)
    assert metrics[4]["learning_rate"] == 1e-4 and metrics[4]["total_steps"] == 10
    assert metrics[4]["recovered_from_checkpoint"] is True and "recovered_from_checkpoint" not in metrics[5]
    checkpoints = http.get(f"/v1/fine_tuning/jobs/{job_id}/checkpoints", headers=auth).json()["data"]
    assert [c["step_number"] for c in checkpoints] == [6]
    assert checkpoints[0]["metrics"]["train_loss"] == pytest.approx(2.4)


def test_the_divergence_guard_is_set_per_job(setup):
    platform, http, scheduler, executor, create_job, job, auth = setup
    job_id = create_job(divergence={"loss_multiple": 3.0, "patience_steps": 7})
    scheduler.tick()
    spec = executor.launched[0]
    assert (spec.divergence_loss_multiple, spec.divergence_patience_steps) == (3.0, 7)
    assert spec.divergence_min_increase == platform.settings.divergence_min_increase  # the platform default
    assert job(job_id)["divergence"] == {"loss_multiple": 3.0, "patience_steps": 7,
                                         "min_increase": platform.settings.divergence_min_increase}
    body = {"model": "tiny-base", "training_file": spec.training_file.file_id, "divergence": {"loss_multiple": 0.5}}
    bad = http.post("/v1/fine_tuning/jobs", json=body, headers=auth)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "divergence.loss_multiple"


def test_a_lost_attempt_is_requeued_at_once_not_after_its_lease(setup):
    platform, http, scheduler, executor, create_job, job, auth = setup
    job_id = create_job()
    scheduler.tick()
    spec = executor.launched[0]
    assert _report(http, spec, "heartbeat", {"step": 1}).status_code == 200  # a fresh lease
    executor.states[1] = PollResult("lost", detail="a node of the attempt was lost: node n1 died")
    scheduler.tick()
    with platform.db.session() as session:
        first = attempt_of(session, job_id, 1)
        assert (first.status, first.failure_class, first.exit_code) == ("lost", "platform", None)
    assert job(job_id)["attempt"] == 2 and job(job_id)["status"] == "running"
    events = http.get(f"/v1/fine_tuning/jobs/{job_id}/events?limit=100", headers=auth).json()["data"]
    [restart] = [e for e in events if e["data"].get("code") == "job_restarted"]
    assert "node n1 died" in restart["message"]
    assert executor.released == [1]  # what the lost attempt held is freed


def test_an_attempt_ended_by_its_report_is_released_once_its_process_is_gone(setup):
    platform, http, scheduler, executor, create_job, job, _auth = setup
    job_id = create_job()
    scheduler.tick()
    spec = executor.launched[0]
    adapter = f"tenants/{spec.tenant_id}/jobs/{job_id}/artifacts/adapter"
    assert _report(http, spec, "result", {"seq": 1, "trained_tokens": 10, "adapter_prefix": adapter}).status_code == 200
    assert job(job_id)["status"] == "succeeded"
    scheduler.tick()
    assert executor.released == []  # still flushing its last reports: left alone
    executor.states[1] = PollResult("exited", 0)
    scheduler.tick()
    assert executor.released == [1]
    scheduler.tick()
    assert executor.released == [1]  # once
    with platform.db.session() as session:
        assert attempt_of(session, job_id, 1).handle["released_at"] > 0


def test_an_ended_attempt_that_does_not_exit_is_released_after_the_grace(setup):
    platform, http, scheduler, executor, create_job, job, auth = setup
    job_id = create_job()
    scheduler.tick()
    http.post(f"/v1/fine_tuning/jobs/{job_id}/cancel", headers=auth)
    scheduler.tick()  # signalled; the fake keeps "running"
    assert executor.released == []
    with platform.db.session() as session:
        attempt_of(session, job_id, 1).ended_at = time.time() - platform.settings.preempt_grace_s - 1
    scheduler.tick()
    assert executor.released == [1]


def test_gpus_busy_with_other_work_are_not_given_to_jobs(setup):
    _platform, _http, scheduler, executor, create_job, job, _auth = setup
    executor.gpus = 2

    def shared_capacity() -> Capacity:  # 2 GPUs, 1 of them used by someone else
        return Capacity([NodeCapacity("fake", 2, 1 - len([s for s in executor.states.values()
                                                          if s.state == "running"]))])

    executor.capacity = shared_capacity
    first, second = create_job(), create_job()
    scheduler.tick()
    scheduler.tick()
    assert job(first)["status"] == "running" and job(second)["status"] == "queued"
    executor.capacity = lambda: Capacity([NodeCapacity("fake", 2, 1)])  # the other work ended
    scheduler.tick()
    assert job(second)["status"] == "running"


def test_an_executor_that_cannot_tell_its_capacity_starts_nothing_and_fails_nothing(setup):
    platform, _http, scheduler, executor, create_job, job, _auth = setup
    working = executor.capacity

    def unreachable():
        raise ConnectionError("the Ray head is restarting")

    executor.capacity = unreachable
    job_id = create_job()
    scheduler.tick()
    assert job(job_id)["status"] in ("validating_files", "queued") and executor.launched == []
    executor.capacity = working
    scheduler.tick()
    assert job(job_id)["status"] == "running"


def test_the_trackers_credentials_go_to_the_jobs_current_attempt_only(setup):
    platform, http, scheduler, executor, create_job, job, auth = setup
    assert http.post("/v1/secrets", json={"name": "MY_WANDB", "value": "local-secret-key-1"},
                     headers=auth).status_code in (200, 201)
    job_id = create_job(integrations=[{"type": "wandb", "wandb": {"project": "p", "api_key_secret": "MY_WANDB"}},
                                      {"type": "mlflow", "mlflow": {"tracking_uri": "https://mlflow.example.com",
                                                                    "token_secret": "MY_WANDB"}}])
    scheduler.tick()
    [spec] = executor.launched
    asked = http.get(f"/internal/v1/jobs/{job_id}/credentials", params={"attempt": spec.attempt},
                     headers={"Authorization": f"Bearer {spec.job_token}"})
    assert asked.status_code == 200
    tracking = asked.json()["tracking"]
    assert tracking["wandb"] == {"mode": "online", "base_url": "https://api.wandb.ai", "api_key": "local-secret-key-1"}
    assert tracking["mlflow"] == {"tracking_uri": "https://mlflow.example.com", "operator": False,
                                  "token": "local-secret-key-1"}
    for headers, attempt in (({"Authorization": "Bearer not-the-token"}, spec.attempt),
                             ({"Authorization": f"Bearer {spec.job_token}"}, spec.attempt + 1), ({}, spec.attempt)):
        refused = http.get(f"/internal/v1/jobs/{job_id}/credentials", params={"attempt": attempt}, headers=headers)
        assert refused.status_code in (401, 403, 404, 409) and "local-secret-key-1" not in refused.text
    # the secrets never show in what the tenant reads back
    assert "local-secret-key-1" not in http.get(f"/v1/fine_tuning/jobs/{job_id}", headers=auth).text


def test_a_cancel_that_a_launch_overwrote_still_ends_the_job_cancelled(setup):
    """The state a launch racing a cancel could leave (status running, cancel asked for): the
    next tick stops the attempt and the job ends cancelled, instead of running with nothing."""
    platform, _http, scheduler, executor, create_job, job, _auth = setup
    job_id = create_job()
    scheduler.tick()
    assert job(job_id)["status"] == "running"
    with platform.db.session() as session:
        row = job_repo.get_for_update(session, job_id)
        row.cancel_requested = True  # what a cancel leaves when its status was overwritten by the launch
    scheduler.tick()
    assert job(job_id)["status"] == "cancelled"
    assert executor.signals == [(1, "cancel")]
    with platform.db.session() as session:
        assert attempt_of(session, job_id, 1).status == "cancelled"


def test_a_platform_side_read_for_update_holds_sqlites_write_lock(setup, db_backend):
    """On SQLite, `get_for_update` begins the transaction at once (BEGIN IMMEDIATE): a status read
    there cannot be changed by another writer before the write that depends on it."""
    platform, _http, _scheduler, _executor, create_job, _job, _auth = setup
    job_id = create_job()
    with platform.db.session() as session:
        job_repo.get_for_update(session, job_id)
        if db_backend == "sqlite":
            assert session.connection().connection.dbapi_connection.in_transaction
            import sqlite3

            other = sqlite3.connect(platform.settings.resolved_database_url.split("///", 1)[1], timeout=0.2)
            try:
                with pytest.raises(sqlite3.OperationalError, match="locked"):
                    other.execute("UPDATE jobs SET cancel_requested = 1 WHERE job_id = ?", (job_id,))
            finally:
                other.close()


def test_a_draining_node_takes_nothing_new_and_its_attempts_checkpoint_and_move(setup):
    platform, _http, scheduler, executor, create_job, job, _auth = setup
    executor.capacity = lambda: Capacity([NodeCapacity("a", 1, 1), NodeCapacity("b", 1, 1)])
    first = create_job()
    scheduler.tick()
    with platform.db.session() as session:
        node = attempt_of(session, first, 1).placement["node"]
    other = "b" if node == "a" else "a"
    # the node under the attempt is reclaimed: its attempt is asked to checkpoint and stop, and the
    # next job goes to the other node only
    executor.capacity = lambda: Capacity([NodeCapacity(node, 1, 0, draining=True), NodeCapacity(other, 1, 1)])
    second = create_job()
    scheduler.tick()
    with platform.db.session() as session:
        assert attempt_of(session, first, 1).handle["reclaim_requested"]
        assert attempt_of(session, second, 1).placement["node"] == other
    scheduler.tick()  # the reconcile sends the checkpoint signal once
    assert executor.signals.count((1, "preempt")) == 1
    events = [e["message"] for e in _http.get(f"/v1/fine_tuning/jobs/{first}/events",
                                              headers=_auth).json()["data"]]
    assert any(m.startswith("The node under attempt 1 is being reclaimed") for m in events)
    executor.states[1] = PollResult("exited", TrainerExit.PREEMPTED)
    scheduler.tick()  # requeued; the drained node still takes nothing, the other is busy
    assert job(first)["status"] == "queued"


def test_the_executor_gets_ready_each_time_this_process_starts_leading(tmp_path, database_url):
    platform = make_platform(tmp_path, database_url, scheduler_tick_s=0.05)
    executor = FakeExecutor()
    scheduler = Scheduler(platform, executor)
    scheduler.start()
    try:
        deadline = time.monotonic() + 20
        while platform.scheduler_role != "leader" and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # a few ticks more as the leader
    finally:
        scheduler.stop()
    assert platform.scheduler_role == "off"
    assert executor.prepared == 1  # once, on becoming the leader; not on every tick
    platform.db.dispose()


def test_the_trainers_output_is_kept_while_it_runs_and_at_its_end(setup):
    from tuneforge.storage import layout

    platform, http, scheduler, executor, create_job, job, _auth = setup
    job_id = create_job()
    scheduler.tick()
    spec = executor.launched[0]
    key = layout.trainer_log_key(spec.tenant_id, job_id, 1)
    executor.log_tail = lambda handle, max_bytes=4000: f"step 1 with {spec.job_token}\nstep 2 half"
    scheduler.tick()
    assert platform.store.get_bytes(key) == b"step 1 with ***\n"  # whole lines only, the token scrubbed
    adapter = f"tenants/{spec.tenant_id}/jobs/{job_id}/artifacts/adapter"
    assert _report(http, spec, "result", {"seq": 1, "trained_tokens": 10, "adapter_prefix": adapter}).status_code == 200
    executor.states[1] = PollResult("exited", 0)
    scheduler.tick()
    assert executor.released == [1]
    assert platform.store.get_bytes(key) == b"step 1 with ***\nstep 2 half"  # the last copy: everything


def test_a_deleted_tenants_ended_attempt_leaves_no_log_behind(setup):
    from tuneforge.services.tenancy import deletion
    from tuneforge.storage import layout

    platform, http, scheduler, executor, create_job, job, _auth = setup
    create_job()
    scheduler.tick()
    spec = executor.launched[0]
    with platform.db.session() as session:
        assert deletion.delete_tenant(session, platform.store, "alpha").status == "deleting"  # a trainer runs
    scheduler.tick()  # the cancel reaches the trainer; its attempt ends; the purge follows
    assert executor.signals == [(1, "cancel")]
    with platform.db.session() as session:
        assert deletion.delete_tenant(session, platform.store, "alpha").status == "deleted"
    executor.states[1] = PollResult("exited", -9)
    scheduler.tick()
    assert executor.released == [1]
    assert platform.store.list(layout.tenant_prefix(spec.tenant_id)) == []
