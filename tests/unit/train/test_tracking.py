"""Experiment tracking from the trainer: TensorBoard event files read back with tensorboard's own
reader; a tracker that fails or stalls never fails or holds up the job."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import pytest

from tests.helpers.tiny import TENANT_ID, stage_job
from tuneforge.domain.exit_codes import TrainerExit
from tuneforge.storage import layout
from tuneforge.train import tracking
from tuneforge.train.reporter import RecordingReporter
from tuneforge.train.runner import run_attempt


def _scalars(folder: Path) -> tuple[dict[str, list[tuple[int, float]]], dict[str, list[str]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    found: dict[str, list[tuple[int, float]]] = {}
    texts: dict[str, list[str]] = {}
    for path in sorted(folder.iterdir()):
        events = EventAccumulator(str(path), size_guidance={"scalars": 0, "tensors": 0})
        events.Reload()
        for tag in events.Tags()["scalars"]:
            found.setdefault(tag, []).extend((e.step, e.value) for e in events.Scalars(tag))
        for tag in events.Tags()["tensors"]:
            texts.setdefault(tag, []).extend(
                t.tensor_proto.string_val[0].decode() for t in events.Tensors(tag))
    return found, texts


def test_tensorboard_gets_every_step_and_the_final_figures(tmp_path: Path, tiny_model_dir: Path) -> None:
    spec, store = stage_job(tmp_path, tiny_model_dir, validation=None, hyperparameters={"n_epochs": 2})
    spec = replace(spec, integrations=[{"type": "tensorboard"}])
    reporter = RecordingReporter()
    assert run_attempt(spec, store, reporter) == TrainerExit.SUCCESS
    prefix = layout.tensorboard_prefix(TENANT_ID, spec.job_id)
    files = store.download_prefix(prefix, tmp_path / "tb")
    assert files and all(path.name.endswith(".attempt-1") for path in files)
    scalars, texts = _scalars(tmp_path / "tb")
    sent = {e["data"]["step"]: e["data"] for e in reporter.events("metrics")}
    losses = scalars["train/loss"]
    assert [step for step, _ in losses] == sorted(sent) and len(losses) == spec_steps(sent)
    assert all(value == pytest.approx(sent[step]["train_loss"], rel=1e-6) for step, value in losses)
    assert [step for step, _ in scalars["train/learning_rate"]] == sorted(sent)
    assert scalars["final/steps"][0][1] == max(sent)
    assert "n_epochs" in texts["hyperparameters/text_summary"][0]
    assert texts["final/artifact/text_summary"][0] == f"/v1/fine_tuning/jobs/{spec.job_id}/download?artifact=adapter"
    assert not [e for e in reporter.events("message") if "integration" in e["message"]]


def spec_steps(sent: dict) -> int:
    return next(iter(sent.values()))["total_steps"]


def test_a_failing_tracker_is_dropped_and_the_job_goes_on(tmp_path: Path, tiny_model_dir: Path, monkeypatch) -> None:
    def broken(self, step, metrics):  # noqa: ANN001
        raise OSError("disk full")

    monkeypatch.setattr(tracking.TensorBoardTracker, "log", broken)
    spec, store = stage_job(tmp_path, tiny_model_dir)
    reporter = RecordingReporter()
    assert run_attempt(replace(spec, integrations=[{"type": "tensorboard"}]), store, reporter) == TrainerExit.SUCCESS
    [warning] = [e for e in reporter.events("message") if "integration" in e["message"]]
    assert warning["level"] == "warn" and warning["data"] == {"integration": "tensorboard", "error": "OSError"}
    assert "disk full" not in warning["message"]  # the exception's text stays in the operator's log


class _Stalled:
    name = "stalled"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.logged = 0

    def start(self, config):  # noqa: ANN001
        self.release.wait(10)

    def log(self, step, metrics):  # noqa: ANN001
        self.logged += 1

    def sync(self) -> None:
        pass

    def finish(self, summary):  # noqa: ANN001
        pass


def test_a_stalled_tracker_never_holds_the_loop_and_the_queue_is_bounded(monkeypatch) -> None:
    monkeypatch.setattr(tracking, "MAX_PENDING", 5)
    stalled, reporter = _Stalled(), RecordingReporter()
    trackers = tracking.Trackers([stalled], reporter)
    trackers.start({})
    for step in range(1, 21):
        trackers.log(step, {"train_loss": 1.0})
    assert stalled.logged == 0  # the loop went on while the tracker was still stuck in its start
    stalled.release.set()
    trackers.finish({})
    assert trackers.dropped > 0 and stalled.logged == 20 - trackers.dropped
    [warning] = [e for e in reporter.events("message") if "dropped" in e["message"]]
    assert warning["data"] == {"dropped": trackers.dropped}
