"""Sweeps driven by the scheduler with a fake executor and the trainers' reports: trials are
ordinary jobs created up to max_parallel, ASHA stops the ones behind at each rung (their jobs
cancelled, their GPUs freed for the next trial), the best finished trial wins and its model can
be promoted; a sweep continues under a new scheduler (a restart), and cancelling it cancels its
running trials. Bad sweep bodies answer 400 naming the field."""

from __future__ import annotations

import io

import pytest

from tests.helpers.platform import chat_lines
from tests.unit.scheduler.test_loop import _report, setup  # noqa: F401 - the fixture, reused
from tuneforge.scheduler.loop import Scheduler
from tuneforge.sweeps import space as sweep_space

RATES = [0.01, 0.02, 0.03, 0.04]


def _files(http, auth) -> tuple[str, str]:
    ids = []
    for name in ("train.jsonl", "valid.jsonl"):
        ids.append(http.post("/v1/files", files={"file": (name, io.BytesIO(chat_lines(20)))},
                             data={"purpose": "fine-tune"}, headers=auth).json()["id"])
    return ids[0], ids[1]


def _sweep_body(training: str, validation: str, **extra) -> dict:
    return {"job": {"model": "tiny-base", "training_file": training, "validation_file": validation,
                    "method": {"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 4}}}},
            "search_space": {"learning_rate": {"type": "choice", "values": RATES}},
            "max_parallel": 2, "early_stopping": {"type": "asha", "min_epochs": 1, "eta": 2}, **extra}


def _spec_of(executor, job_id: str):
    return next(spec for spec in reversed(executor.launched) if spec.job_id == job_id)


def _checkpoint(http, spec, seq: int, epoch: int, loss: float) -> None:
    step = epoch * 10
    prefix = f"tenants/{spec.tenant_id}/jobs/{spec.job_id}/checkpoints/step-{step}"
    answer = _report(http, spec, "checkpoints", {"seq": seq, "step": step, "prefix": prefix, "epoch": epoch,
                                                 "metrics": {"train_loss": loss, "valid_loss": loss}})
    assert answer.status_code == 200, answer.text


def _finish(platform, http, spec, seq: int) -> None:
    adapter = f"tenants/{spec.tenant_id}/jobs/{spec.job_id}/artifacts/adapter"
    platform.store.put_bytes(f"{adapter}/adapter_config.json", b"{}")
    measured = {"golden.loss": 1.0, "golden.token_accuracy": 0.5, "safety.refusal_rate": 1.0}  # the default gates pass
    assert _report(http, spec, "result", {"seq": seq, "trained_tokens": 10, "adapter_prefix": adapter,
                                          "eval": {"base": measured, "fine_tuned": measured}}).status_code == 200


def test_asha_stops_the_trials_behind_and_the_best_wins(setup):
    platform, http, scheduler, executor, _create_job, job, auth = setup
    executor.gpus = 2
    training, validation = _files(http, auth)
    created = http.post("/v1/fine_tuning/sweeps", headers=auth, json=_sweep_body(training, validation))
    assert created.status_code == 200, created.text
    sweep_id = created.json()["id"]
    assert created.json()["sampler"] == "grid" and created.json()["max_trials"] == 4

    def sweep():
        return http.get(f"/v1/fine_tuning/sweeps/{sweep_id}", headers=auth).json()

    scheduler.tick()  # two trials created (max_parallel), then validated and launched
    scheduler.tick()
    trials = sweep()["trials"]
    order = [sweep_space.grid_point(sweep_space.parse_space(_sweep_body("", "")["search_space"]), i, 0)
             for i in range(4)]  # the grid in the order the sweep's seed (0) shuffles it
    assert sorted(point["learning_rate"] for point in order) == RATES
    assert [(t["number"], t["params"], t["status"]) for t in trials] == [
        (0, order[0], "running"), (1, order[1], "running")]
    jobs = [t["job_id"] for t in trials]
    assert [job(j)["status"] for j in jobs] == ["running", "running"]
    assert job(jobs[0])["method"]["supervised"]["hyperparameters"]["learning_rate"] == order[0]["learning_rate"]
    assert job(jobs[0])["metadata"] == {"sweep_id": sweep_id, "sweep_trial": "0"}

    t0, t1 = (_spec_of(executor, j) for j in jobs)
    _checkpoint(http, t0, 1, epoch=1, loss=1.0)
    scheduler.tick()
    _checkpoint(http, t1, 1, epoch=1, loss=2.0)  # behind trial 0 at the first rung: stopped
    scheduler.tick()
    state = sweep()
    assert [t["status"] for t in state["trials"][:2]] == ["running", "stopped"]
    assert state["trials"][1]["rungs"] == [2.0]
    assert job(jobs[1])["status"] == "cancelled"
    events = [e["message"] for e in http.get(f"/v1/fine_tuning/jobs/{jobs[1]}/events", headers=auth).json()["data"]]
    assert any(m.startswith(f"Stopped early by sweep {sweep_id}: validation loss 2 at epoch 1") for m in events)
    assert len(state["trials"]) == 3  # the freed slot went to the next trial

    # the scheduler restarts: a new one carries on from the database
    scheduler = Scheduler(platform, executor)
    scheduler.tick()
    t2 = _spec_of(executor, sweep()["trials"][2]["job_id"])
    _checkpoint(http, t0, 2, epoch=2, loss=0.8)
    _checkpoint(http, t2, 1, epoch=1, loss=0.9)  # among the best 2 of 3 at rung 1: goes on
    scheduler.tick()
    _checkpoint(http, t2, 2, epoch=2, loss=0.95)  # behind trial 0's 0.8 at rung 2: stopped
    scheduler.tick()
    scheduler.tick()
    state = sweep()
    assert [t["status"] for t in state["trials"]] == ["running", "stopped", "stopped", "running"]
    t3 = _spec_of(executor, state["trials"][3]["job_id"])
    _checkpoint(http, t3, 1, epoch=1, loss=3.0)
    _checkpoint(http, t0, 3, epoch=4, loss=0.5)
    _finish(platform, http, t0, 4)
    scheduler.tick()
    scheduler.tick()
    state = sweep()
    assert state["status"] == "succeeded", state
    assert [t["status"] for t in state["trials"]] == ["completed", "stopped", "stopped", "stopped"]
    assert state["stopped_early"] == 3
    assert state["best_trial"]["number"] == 0 and state["best_trial"]["objective"] == 0.5
    assert state["best_trial"]["fine_tuned_model"] == job(jobs[0])["fine_tuned_model"]

    promoted = http.post(f"/v1/fine_tuning/sweeps/{sweep_id}/promote", headers=auth, json={"stage": "staging"})
    assert promoted.status_code == 200, promoted.text
    assert promoted.json()["id"] == job(jobs[0])["fine_tuned_model"] and promoted.json()["stage"] == "staging"


def test_cancelling_a_sweep_cancels_its_running_trials(setup):
    _platform, http, scheduler, executor, _create_job, job, auth = setup
    executor.gpus = 2
    training, validation = _files(http, auth)
    sweep_id = http.post("/v1/fine_tuning/sweeps", headers=auth,
                         json=_sweep_body(training, validation)).json()["id"]
    scheduler.tick()
    scheduler.tick()
    cancelled = http.post(f"/v1/fine_tuning/sweeps/{sweep_id}/cancel", headers=auth).json()
    assert cancelled["status"] == "cancelled"
    assert {job(t["job_id"])["status"] for t in cancelled["trials"]} == {"cancelled"}
    scheduler.tick()
    assert len(http.get(f"/v1/fine_tuning/sweeps/{sweep_id}", headers=auth).json()["trials"]) == 2  # no new trial
    again = http.post(f"/v1/fine_tuning/sweeps/{sweep_id}/cancel", headers=auth)
    assert again.status_code == 400 and again.json()["error"]["code"] == "sweep_not_cancellable"


@pytest.mark.parametrize("change, param", [
    ({"search_space": {"learning_rate": {"type": "gaussian"}}}, "search_space.learning_rate.type"),
    ({"sampler": "grid", "search_space": {"learning_rate": {"type": "uniform", "low": 0.1, "high": 0.2}}}, "sampler"),
    ({"max_parallel": 9}, "max_parallel"),
    ({"objective": {"metric": "train.loss"}}, "objective.metric"),
    ({"objective": {"metric": "eval.exact_match", "goal": "maximize"}}, "early_stopping"),
    ({"job": {"model": "nope", "training_file": "file-x"}}, "model"),
])
def test_a_bad_sweep_answers_400_naming_the_field(setup, change, param):
    _platform, http, _scheduler, _executor, _create_job, _job, auth = setup
    training, validation = _files(http, auth)
    refused = http.post("/v1/fine_tuning/sweeps", headers=auth, json={**_sweep_body(training, validation), **change})
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["param"] == param
    assert http.get("/v1/fine_tuning/sweeps", headers=auth).json()["data"] == []


def test_another_tenants_sweep_is_not_found(setup):
    platform, http, _scheduler, _executor, _create_job, _job, auth = setup
    from tests.helpers.platform import add_tenant

    training, validation = _files(http, auth)
    sweep_id = http.post("/v1/fine_tuning/sweeps", headers=auth, json=_sweep_body(training, validation)).json()["id"]
    other = {"Authorization": f"Bearer {add_tenant(platform, 'beta')}"}
    assert http.get(f"/v1/fine_tuning/sweeps/{sweep_id}", headers=other).status_code == 404
    assert http.post(f"/v1/fine_tuning/sweeps/{sweep_id}/cancel", headers=other).status_code == 404


def test_promoting_a_sweep_without_a_best_trial_answers_409_and_another_tenants_404(setup):
    platform, http, _scheduler, _executor, _create_job, _job, auth = setup
    from tests.helpers.platform import add_tenant

    training, validation = _files(http, auth)
    sweep_id = http.post("/v1/fine_tuning/sweeps", headers=auth, json=_sweep_body(training, validation)).json()["id"]
    early = http.post(f"/v1/fine_tuning/sweeps/{sweep_id}/promote", headers=auth, json={"stage": "production"})
    assert early.status_code == 409 and early.json()["error"]["code"] == "sweep_not_finished"
    assert early.json()["error"]["message"] == f"Sweep {sweep_id} has no best trial yet (it is running)"
    other = {"Authorization": f"Bearer {add_tenant(platform, 'gamma')}"}
    foreign = http.post(f"/v1/fine_tuning/sweeps/{sweep_id}/promote", headers=other, json={"stage": "staging"})
    assert foreign.status_code == 404 and foreign.json()["error"]["code"] == "sweep_not_found"
    assert [s["id"] for s in http.get("/v1/fine_tuning/sweeps", headers=other).json()["data"]] == []


def test_a_huge_grid_with_one_trial_is_created_from_arithmetic(setup):
    """16 parameters of 64 choices (2**96 points) and max_trials 1: the space is validated and
    sized without being built, and the one trial's parameters are drawn lazily."""
    platform, http, scheduler, executor, _create_job, job, auth = setup
    training, validation = _files(http, auth)
    body = _sweep_body(training, validation, max_trials=1, max_parallel=1, early_stopping=None)
    body["search_space"] = {"learning_rate": {"type": "choice", "values": [round(0.0001 * (i + 1), 6)
                                                                            for i in range(64)]},
                            **{f"training_type.p{n}": {"type": "choice", "values": list(range(64))}
                               for n in range(15)}}
    grid = sweep_space.parse_space(body["search_space"])
    assert sweep_space.grid_size(grid) == 2**96
    answer = http.post("/v1/fine_tuning/sweeps", headers=auth, json=body)
    # the grid's first point is checked as a job body: the unknown training_type fields name it
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"].startswith("job.training_type"), answer.text
    body["search_space"] = {"learning_rate": body["search_space"]["learning_rate"],
                            "learning_rate_multiplier": {"type": "choice", "values": [1.0, 2.0]}}
    created = http.post("/v1/fine_tuning/sweeps", headers=auth, json={**body, "seed": 11})
    assert created.status_code == 200, created.text
    assert created.json()["max_trials"] == 1
    scheduler.tick()
    [trial] = http.get(f"/v1/fine_tuning/sweeps/{created.json()['id']}", headers=auth).json()["trials"]
    assert trial["params"] == sweep_space.grid_point(sweep_space.parse_space(body["search_space"]), 0, 11)
