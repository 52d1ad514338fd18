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


# -- wandb and mlflow -----------------------------------------------------------------------------

def _given_access(monkeypatch, found: dict) -> list[int]:
    """The control plane's answer about the trackers (the credentials report); counts the asks."""
    from tuneforge.train import credentials

    asked: list[int] = []

    def fetch_tracking(spec):  # noqa: ANN001
        asked.append(spec.attempt)
        return found

    monkeypatch.setattr(credentials, "fetch_tracking", fetch_tracking)
    return asked


def test_wandb_offline_run_has_every_step_the_config_and_the_final_figures(tmp_path, tiny_model_dir, monkeypatch):
    from tests.helpers.wandb_files import read_run

    _given_access(monkeypatch, {"wandb": {"mode": "offline", "base_url": "https://api.wandb.ai", "api_key": None}})
    spec, store = stage_job(tmp_path, tiny_model_dir, hyperparameters={"n_epochs": 2})
    spec = replace(spec, integrations=[{"type": "wandb", "wandb": {"project": "support-bot", "tags": ["nightly"]}}])
    reporter = RecordingReporter()
    assert run_attempt(spec, store, reporter) == TrainerExit.SUCCESS
    assert not [e for e in reporter.events("message") if "integration" in e["message"]]
    [path] = store.download_prefix(layout.wandb_prefix(TENANT_ID, spec.job_id), tmp_path / "wandb")
    assert path.name == f"run-{spec.job_id}.wandb" and path.parent.name.startswith("offline-run-")
    run = read_run(path)
    assert (run["id"], run["project"], run["name"]) == (spec.job_id, "support-bot", spec.job_id)
    assert run["tags"] == ["tuneforge/finetune", f"tuneforge/{spec.base_model.name}", f"tuneforge/{spec.job_id}",
                           "nightly"]
    assert run["config"]["n_epochs"] == 2 and run["config"]["lora_rank"] == 8
    sent = {e["data"]["step"]: e["data"] for e in reporter.events("metrics")}
    assert sorted(run["history"]) == sorted(sent)
    assert all(run["history"][step]["train/loss"] == pytest.approx(sent[step]["train_loss"], rel=1e-6)
               for step in sent)
    assert run["summary"]["final/steps"] == max(sent)
    assert run["summary"]["final/artifact"] == f"/v1/fine_tuning/jobs/{spec.job_id}/download?artifact=adapter"


def test_wandb_online_logs_with_the_tenants_key_to_the_operators_server_and_shares_nothing_of_the_host(
        tmp_path, tiny_model_dir, monkeypatch):
    import wandb

    seen: dict = {}

    class FakeRun:
        summary: dict = {}

        def log(self, metrics, step):  # noqa: ANN001
            seen.setdefault("steps", []).append(step)

        def finish(self, exit_code):  # noqa: ANN001
            seen["exit_code"] = exit_code

    def init(**kwargs):  # noqa: ANN003
        seen.update(kwargs)
        return FakeRun()

    monkeypatch.setattr(wandb, "init", init)
    _given_access(monkeypatch, {"wandb": {"mode": "online", "base_url": "https://wandb.corp.example",
                                          "api_key": "local-0123456789abcdef"}})
    spec, store = stage_job(tmp_path, tiny_model_dir)
    spec = replace(spec, integrations=[{"type": "wandb", "wandb": {"project": "p", "entity": "team",
                                                                  "name": "first try"}}])
    assert run_attempt(spec, store, RecordingReporter()) == TrainerExit.SUCCESS
    settings = seen["settings"]
    assert (settings.api_key, settings.base_url, settings.mode) == (
        "local-0123456789abcdef", "https://wandb.corp.example", "online")
    assert settings.x_disable_stats and settings.x_disable_meta and not settings.save_code
    assert settings.disable_git and not settings.x_save_requirements
    assert (seen["project"], seen["entity"], seen["name"], seen["id"], seen["resume"]) == (
        "p", "team", "first try", spec.job_id, "allow")
    assert seen["steps"] == sorted(seen["steps"]) and seen["exit_code"] == 0
    assert not store.list(layout.wandb_prefix(TENANT_ID, spec.job_id))  # online: nothing kept beside the job


def test_wandb_online_without_a_key_warns_and_the_job_goes_on(tmp_path, tiny_model_dir, monkeypatch):
    _given_access(monkeypatch, {"wandb": {"mode": "online", "base_url": "https://api.wandb.ai", "api_key": None}})
    spec, store = stage_job(tmp_path, tiny_model_dir)
    reporter = RecordingReporter()
    spec = replace(spec, integrations=[{"type": "wandb", "wandb": {"project": "p"}}])
    assert run_attempt(spec, store, reporter) == TrainerExit.SUCCESS
    [warning] = [e for e in reporter.events("message") if "integration" in e["message"]]
    assert warning["data"] == {"integration": "wandb", "error": "PermissionError"}


def _mlflow_client(uri: str):  # noqa: ANN202
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri)


def test_mlflow_on_the_operators_database_store_gets_params_metrics_and_the_outcome(tmp_path, tiny_model_dir,
                                                                                    monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    asked = _given_access(monkeypatch, {"mlflow": {"tracking_uri": uri, "operator": True}})
    spec, store = stage_job(tmp_path, tiny_model_dir, hyperparameters={"n_epochs": 2})
    spec = replace(spec, integrations=[{"type": "mlflow", "mlflow": {"experiment_name": "support",
                                                                     "tags": {"team": "nlp"}}}])
    reporter = RecordingReporter()
    assert run_attempt(spec, store, reporter) == TrainerExit.SUCCESS
    assert not [e for e in reporter.events("message") if "integration" in e["message"]]
    assert len(asked) == 1
    client = _mlflow_client(uri)
    experiment = client.get_experiment_by_name("support")
    [run] = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == spec.job_id
    assert run.data.tags["tuneforge.job_id"] == spec.job_id and run.data.tags["team"] == "nlp"
    assert run.data.params["n_epochs"] == "2" and run.data.params["lora_rank"] == "8"
    sent = {e["data"]["step"]: e["data"] for e in reporter.events("metrics")}
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert sorted(m.step for m in history) == sorted(sent)
    assert all(m.value == pytest.approx(sent[m.step]["train_loss"], rel=1e-6) for m in history)
    assert run.data.metrics["final/steps"] == max(sent)
    assert run.data.tags["tuneforge.artifact"] == f"/v1/fine_tuning/jobs/{spec.job_id}/download?artifact=adapter"


def test_mlflow_a_resumed_attempt_reopens_its_jobs_run_on_a_file_store(tmp_path, tiny_model_dir):
    uri = (tmp_path / "mlruns").as_uri()
    spec, _store = stage_job(tmp_path, tiny_model_dir)
    access = lambda: {"mlflow": {"tracking_uri": uri, "operator": True}}  # noqa: E731
    first = tracking.MlflowTracker(spec, {"experiment_name": "e"}, access)
    first.start({"n_epochs": 2})
    first.log(1, {"train/loss": 2.0})
    first.finish({}, succeeded=False)  # preempted
    client = _mlflow_client(uri)
    [run] = client.search_runs([client.get_experiment_by_name("e").experiment_id])
    assert run.info.status == "KILLED"
    second = tracking.MlflowTracker(replace(spec, attempt=2), {"experiment_name": "e"}, access)
    second.start({"n_epochs": 2})
    assert second.run_id == run.info.run_id
    assert client.get_run(run.info.run_id).info.status == "RUNNING"
    second.log(2, {"train/loss": 1.5})
    second.finish({"steps": 2}, succeeded=True)
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "train/loss")] == [(1, 2.0), (2, 1.5)]
    assert client.get_run(run.info.run_id).info.status == "FINISHED"


def test_mlflow_a_tenants_server_on_a_private_address_is_never_connected_to(tmp_path, tiny_model_dir, monkeypatch):
    import socket

    from urllib3.util import connection

    monkeypatch.setattr(connection, "create_connection", connection.create_connection)  # undone after the test
    monkeypatch.delenv("TUNEFORGE_EGRESS_ALLOW", raising=False)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    _given_access(monkeypatch, {"mlflow": {"tracking_uri": f"http://127.0.0.1:{port}", "operator": False}})
    spec, store = stage_job(tmp_path, tiny_model_dir)
    reporter = RecordingReporter()
    spec = replace(spec, integrations=[{"type": "mlflow", "mlflow": {"tracking_uri": f"http://127.0.0.1:{port}"}}])
    assert run_attempt(spec, store, reporter) == TrainerExit.SUCCESS
    [warning] = [e for e in reporter.events("message") if "integration" in e["message"]]
    assert warning["data"]["integration"] == "mlflow"
    with pytest.raises(socket.timeout):
        listener.accept()  # nothing ever connected
    listener.close()


def test_a_finished_wandb_offline_run_is_whole_on_disk_when_finish_returns(tmp_path, monkeypatch):
    """wandb's service process writes the run file after `run.finish()` returns: the tracker waits
    for it, so the copy beside the job is never just the file's header. A race: six runs in a row, each
    read the moment its finish returned; without the wait, now and then a run's file was still a bare
    header."""
    from types import SimpleNamespace

    from tests.helpers.wandb_files import read_run, records
    from tuneforge.storage.store import open_store

    store = open_store(f"file://{tmp_path / 'store'}")
    access = {"wandb": {"mode": "offline", "base_url": "https://api.wandb.ai", "api_key": None}}
    for number in range(6):
        job_id = f"ftjob-whole{number}"
        spec = SimpleNamespace(tenant_id=TENANT_ID, job_id=job_id, base_model=SimpleNamespace(name="tiny"))
        tracker = tracking.WandbTracker(spec, store, {"project": "p"}, lambda: access)
        tracker.start({"n_epochs": 1})
        for step in range(1, 6):
            tracker.log(step, {"train/loss": 1.0 / step})
        tracker.finish({"steps": 5}, succeeded=True)
        [path] = store.download_prefix(layout.wandb_prefix(TENANT_ID, job_id), tmp_path / job_id)
        run = read_run(path)
        assert run["id"] == job_id and sorted(run["history"]) == [1, 2, 3, 4, 5]
        assert run["summary"]["final/steps"] == 5
        assert [r.WhichOneof("record_type") for r in records(path)][-1] == "exit"


def test_an_objectives_own_figures_are_tracked_under_train() -> None:
    row = {"step": 2, "train_loss": 1.0, "objective_metrics": {"reward_mean": 0.25}}
    assert tracking.scalars(row) == {"train/loss": 1.0, "train/reward_mean": 0.25}
    assert tracking.scalars({"step": 2, "train_loss": 1.0}) == {"train/loss": 1.0}
