"""`tuneforge jobs follow`: one plain line per metrics update when the output is not a terminal, and
an ETA measured from the steps' own timing, never guessed."""

from __future__ import annotations

import pytest

from tests.helpers.cli import run
from tests.unit.cli.fake_api import ENV, serve, sse
from tuneforge.cli.follow import StepTimer, loss_line

JOB = "ftjob-9Xw68S8EqLkT2mZpR4vBn7Yc"


def _metrics(step: int, loss: float, created_at: int, **more: float) -> dict:
    return {"object": "fine_tuning.job.event", "type": "metrics", "level": "info", "created_at": created_at,
            "message": f"Step {step}/4", "data": {"step": step, "total_steps": 4, "train_loss": loss, **more}}


def _answers(status: str) -> dict:
    events = [{"object": "fine_tuning.job.event", "type": "message", "level": "info", "created_at": 1000,
               "message": "Fine-tuning job started", "data": None},
              _metrics(1, 2.0, 1001), _metrics(2, 1.5, 1002, valid_loss=1.6), _metrics(3, 1.25, 1003),
              _metrics(4, 1.125, 1004)]
    return {f"/fine_tuning/jobs/{JOB}/events": sse(events),
            f"/fine_tuning/jobs/{JOB}": {"id": JOB, "status": status, "fine_tuned_model": None,
                                         "error": {"message": "diverged"} if status == "failed" else None}}


def test_follow_prints_a_plain_line_per_metrics_update_when_stdout_is_not_a_terminal(monkeypatch):
    serve(monkeypatch, _answers("succeeded"))
    done = run("jobs", "follow", JOB, env=ENV)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "step 1/4  loss 2.0000"
    assert lines[1] == "step 2/4  loss 1.5000  val 1.6000"  # the validation loss when the step has one
    assert lines[2].startswith("step 3/4  loss 1.2500") and lines[3].startswith("step 4/4  loss 1.1250")
    assert len(lines) == 4 and "ETA" not in lines[3]  # nothing left at the last step
    assert "Fine-tuning job started" in done.stderr and f"{JOB}: succeeded" in done.stderr


def test_follow_exits_1_when_the_job_fails(monkeypatch):
    serve(monkeypatch, _answers("failed"))
    done = run("jobs", "follow", JOB, env=ENV)
    assert done.returncode == 1
    assert done.stdout.splitlines()[0] == "step 1/4  loss 2.0000"
    assert done.stderr.endswith(f"error: {JOB} failed: diverged\n")


def test_follow_json_prints_only_the_events(monkeypatch):
    serve(monkeypatch, _answers("succeeded"))
    done = run("jobs", "follow", JOB, "--json", env=ENV)
    assert done.returncode == 0 and len(done.stdout.splitlines()) == 5 and "step 1/4" not in done.stdout


def test_no_eta_until_two_steps_are_timed_then_steps_left_times_seconds_per_step():
    timer = StepTimer()
    assert timer.eta_s(0, 100) is None
    timer.observe(1, arrived_s=50.0)
    assert timer.eta_s(1, 100) is None  # one step seen: nothing measured (never a 9m55s guess)
    timer.observe(2, arrived_s=50.5)
    assert timer.eta_s(2, 100) is None  # one step timed
    timer.observe(3, arrived_s=51.0)
    assert timer.seconds_per_step() == pytest.approx(0.5)
    assert timer.eta_s(3, 100) == pytest.approx(97 * 0.5)
    assert loss_line({"step": 3, "total_steps": 100, "train_loss": 1.0}, timer.eta_s(3, 100)) == \
        "step 3/100  loss 1.0000  ETA 0m48s"
    assert timer.eta_s(100, 100) is None


def test_steps_replayed_at_once_are_timed_by_their_own_clock():
    timer = StepTimer()
    for step, created_at in ((1, 1000), (2, 1004), (3, 1008), (4, 1012)):
        timer.observe(step, arrived_s=7.0 + step * 1e-4, created_s=created_at)  # arrived together on connect
    assert timer.seconds_per_step() == pytest.approx(4.0)
    assert timer.eta_s(4, 10) == pytest.approx(24.0)


def test_a_resumed_attempt_starts_the_timing_again():
    timer = StepTimer()
    for step, at in ((5, 0.0), (6, 1.0), (7, 2.0)):
        timer.observe(step, arrived_s=at)
    assert timer.seconds_per_step() == pytest.approx(1.0)
    timer.observe(4, arrived_s=600.0)  # lost, requeued, resumed from the checkpoint at step 4
    assert timer.seconds_per_step() is None
    timer.observe(6, arrived_s=603.0)
    assert timer.seconds_per_step() == pytest.approx(1.5)
