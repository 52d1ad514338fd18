"""Preemption inside a step, divergence, time-based checkpoints, simulated OOM, SIGKILL at random steps."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import safetensors.torch
import torch

import tuneforge
from tests.helpers.fake_control_plane import FakeControlPlane
from tests.helpers.tiny import TENANT_ID, next_attempt, stage_job
from tuneforge.domain.exit_codes import TrainerExit
from tuneforge.domain.metrics import metrics_data
from tuneforge.storage import layout
from tuneforge.train import checkpoint as ckpt
from tuneforge.train.reporter import RecordingReporter
from tuneforge.train.runner import run_attempt

OPTIONS = {
    "hyperparameters": {"n_epochs": 3, "batch_size": 4, "micro_batch_size": 1, "warmup_ratio": 0.2},
    "lora": {"dropout": 0.1},
    "checkpoint": {"every_steps": 3, "keep_last": 3},
}


def _adapter(store, spec) -> dict[str, torch.Tensor]:
    prefix = layout.artifact_prefix(spec.tenant_id, spec.job_id, "adapter")
    return safetensors.torch.load(store.get_bytes(f"{prefix}/adapter_model.safetensors"))


def _losses(reporter: RecordingReporter) -> dict[int, float]:
    return {e["data"]["step"]: e["data"]["train_loss"] for e in reporter.events("metrics")}


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_model_dir):
    """An uninterrupted run: per-step losses and final adapter."""
    root = tmp_path_factory.mktemp("reference")
    spec, store = stage_job(root, tiny_model_dir, **OPTIONS)
    reporter = RecordingReporter()
    assert run_attempt(spec, store, reporter) == TrainerExit.SUCCESS
    return _losses(reporter), _adapter(store, spec)


def _same_adapter(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)


@pytest.mark.parametrize("grace_s", [0.0, 90.0])
def test_notice_mid_step_loses_no_completed_step_and_resumes_exactly(
    tmp_path: Path, tiny_model_dir: Path, reference, grace_s: float
) -> None:
    first, store = stage_job(tmp_path, tiny_model_dir, extra={"preempt_during_step": 5}, **OPTIONS)
    first = replace(first, preempt_grace_s=grace_s)
    reporter = RecordingReporter()
    assert run_attempt(first, store, reporter) == TrainerExit.PREEMPTED
    # no grace left: step 5 is abandoned and rewound; plenty of grace: step 5 finishes
    kept = 4 if grace_s == 0 else 5
    assert [c["step"] for c in reporter.of_kind("checkpoints")] == [3, kept]
    assert max(_losses(reporter)) == kept

    second = RecordingReporter(attempt=2)
    resumed = replace(next_attempt(first), extra={})
    assert run_attempt(resumed, store, second) == TrainerExit.SUCCESS
    losses = {**_losses(reporter), **_losses(second)}
    assert min(_losses(second)) == kept + 1
    assert losses == reference[0]  # bit-identical per-step losses
    assert _same_adapter(_adapter(store, first), reference[1])


def test_loss_far_above_its_best_stops_the_job_without_saving(tmp_path: Path, tiny_model_dir: Path) -> None:
    spec, store = stage_job(tmp_path, tiny_model_dir, checkpoint={"every_steps": 1}, hyperparameters={"n_epochs": 8})
    # a multiple below 1 makes every step "far above" the best: the guard must fire `patience` steps after
    # the lowest value starts to count (step 10, once the moving average spans its window)
    spec = replace(spec, divergence_loss_multiple=0.5, divergence_patience_steps=3, divergence_min_increase=-1.0)
    reporter = RecordingReporter()
    assert run_attempt(spec, store, reporter) == TrainerExit.USER_ERROR
    failure = reporter.of_kind("failure")[0]
    assert failure["code"] == "training_diverged"
    assert "at step 12" in failure["message"] and "learning_rate_multiplier" in failure["message"]
    assert [c["step"] for c in reporter.of_kind("checkpoints")] == list(range(1, 10))  # none during the streak
    assert max(_losses(reporter)) == 12


def test_a_normal_run_never_trips_the_divergence_guard(tmp_path: Path, tiny_model_dir: Path) -> None:
    spec, store = stage_job(tmp_path, tiny_model_dir, hyperparameters={"n_epochs": 4})
    spec = replace(spec, divergence_loss_multiple=4.0, divergence_patience_steps=2)
    assert run_attempt(spec, store, RecordingReporter()) == TrainerExit.SUCCESS


def test_time_based_checkpoints(tmp_path: Path, tiny_model_dir: Path) -> None:
    spec, store = stage_job(tmp_path, tiny_model_dir, checkpoint={"every_steps": 0, "every_minutes": 1e-6,
                                                                  "keep_last": 2, "every_epoch": False})
    reporter = RecordingReporter()
    assert run_attempt(spec, store, reporter) == TrainerExit.SUCCESS
    steps = [c["step"] for c in reporter.of_kind("checkpoints")]
    assert steps == list(range(1, 7))  # every step, as the minutes elapsed each time
    kept = ckpt.checkpoint_dirs(store, layout.checkpoints_prefix(TENANT_ID, spec.job_id))
    assert sorted(step for step, _ in kept) == [5, 6]  # keep_last still applies (by count: not by epoch)


def test_simulated_oom_exits_out_of_memory(tmp_path: Path, tiny_model_dir: Path) -> None:
    spec, store = stage_job(tmp_path, tiny_model_dir, hyperparameters={"micro_batch_size": 4},
                            extra={"simulate_oom_above_micro_batch": 2})
    reporter = RecordingReporter()
    assert run_attempt(spec, store, reporter) == TrainerExit.OUT_OF_MEMORY
    [failure] = reporter.of_kind("failure")
    assert failure["classification"] == "out_of_memory" and failure["code"] == "out_of_memory"
    assert failure["correlation_id"].startswith("err_")
    fits = replace(spec, hyperparameters=replace(spec.hyperparameters, micro_batch_size=2))
    assert run_attempt(fits, store, RecordingReporter()) == TrainerExit.SUCCESS


def test_a_corrupt_newest_checkpoint_is_reported_on_resume(tmp_path: Path, tiny_model_dir: Path) -> None:
    first, store = stage_job(tmp_path, tiny_model_dir, checkpoint={"every_steps": 2, "every_epoch": False},
                             extra={"stop_after_step": 4})
    reporter = RecordingReporter()
    assert run_attempt(first, store, reporter) == TrainerExit.PREEMPTED
    step2 = layout.checkpoint_prefix(TENANT_ID, first.job_id, 2)
    step4 = layout.checkpoint_prefix(TENANT_ID, first.job_id, 4)
    # the checkpoint's history rebuilds each step's metrics event exactly (what the
    # control plane uses to recover reports lost with a killed trainer)
    history = json.loads(store.get_bytes(f"{step2}/{layout.TRAINER_STATE_NAME}"))["history"]
    sent = {e["data"]["step"]: e["data"] for e in reporter.events("metrics")}
    assert [metrics_data(row, sent[1]["total_steps"]) for row in history] == [sent[1], sent[2]]
    store.put_bytes(f"{step4}/adapter_model.safetensors", b"truncated")
    second = RecordingReporter(attempt=2)
    assert run_attempt(replace(next_attempt(first), extra={}), store, second) == TrainerExit.SUCCESS
    warning = [e for e in second.events("message") if "corrupt" in e["message"]]
    assert warning and warning[0]["data"] == {"skipped_steps": [4], "resumed_from_step": 2}
    [told] = second.of_kind("resumed")
    assert (told["step"], told["prefix"], told["total_steps"]) == (2, step2, sent[1]["total_steps"])


def _start(spec_path: Path) -> subprocess.Popen:
    src = str(Path(tuneforge.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))}
    return subprocess.Popen([sys.executable, "-m", "tuneforge.train", str(spec_path)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def test_sigkill_at_a_random_step_then_resume_is_bit_identical(tmp_path: Path, tiny_model_dir: Path,
                                                                 reference) -> None:
    kill_after = random.Random(os.getpid()).randint(4, 8)  # a random step, logged on failure
    with FakeControlPlane() as plane:
        first, store = stage_job(tmp_path, tiny_model_dir, callback_url=plane.url, **OPTIONS)
        first.write(tmp_path / "spec1.json")
        process = _start(tmp_path / "spec1.json")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and process.poll() is None:
            steps = [e["data"]["step"] for e in plane.accepted_events() if e["type"] == "metrics"]
            if steps and max(steps) >= kill_after:
                break
            time.sleep(0.02)
        process.send_signal(signal.SIGKILL)
        process.wait(30)
        assert process.returncode == -signal.SIGKILL, f"killed after step {kill_after}: {process.stderr.read()}"

        second = next_attempt(first)
        second.write(tmp_path / "spec2.json")
        resumed = _start(tmp_path / "spec2.json")
        _, stderr = resumed.communicate(timeout=120)
        assert resumed.returncode == TrainerExit.SUCCESS, stderr[-2000:]
    by_attempt: dict[int, dict[int, float]] = {}
    for event, attempt in plane.accepted_events_with_attempt():
        if event["type"] == "metrics":
            by_attempt.setdefault(attempt, {})[event["data"]["step"]] = event["data"]["train_loss"]
    resumed_from = min(by_attempt[2]) - 1
    assert resumed_from % 3 == 0 and resumed_from <= max(by_attempt[1])  # the newest checkpoint before the kill
    # steps trained twice give the same loss both times; together they are the reference run
    assert all(by_attempt[1][s] == by_attempt[2][s] for s in by_attempt[2] if s in by_attempt[1])
    assert {**by_attempt[1], **by_attempt[2]} == reference[0], f"killed after step {kill_after}"
    assert _same_adapter(_adapter(store, first), reference[1])
