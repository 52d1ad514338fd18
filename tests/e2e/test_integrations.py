"""Experiment tracking end to end (docs/openai-compat.md, integrations): a job created with the
official SDK logs to a real MLflow tracking server on loopback (allow-listed by the operator) and
to W&B (offline, as an air-gapped operator runs it: the run file is downloadable beside the job
and read back here), with the tenant's W&B key taken from its secrets."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile

import httpx
import pytest

from tests.e2e.conftest import start_plane
from tests.e2e.test_lifecycle import wait_for
from tests.helpers.net import free_port, wait_for_http
from tests.helpers.wandb_files import read_run
from tuneforge.demo.dataset import DEMO_HYPERPARAMETERS, chat_example, demo_facts, write_jsonl

pytestmark = [pytest.mark.e2e, pytest.mark.sqlite_pass_only]


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """A real MLflow tracking server (SQLite backend) on 127.0.0.1, without its job runner (the
    background workers MLflow 3 starts for its own server-side jobs, which tracking never uses)."""
    root = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    log = (root / "server.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}", "--default-artifact-root", str(root / "artifacts")],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    try:
        wait_for_http(f"http://127.0.0.1:{port}/health", timeout_s=180, alive=lambda: process.poll() is None)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


def test_a_job_logs_to_a_real_mlflow_server_and_to_wandb_offline(mlflow_server, tmp_path, database_url,
                                                                  tiny_model_dir):
    from mlflow import MlflowClient

    running = start_plane(tmp_path, database_url, tiny_model_dir, egress_allow="127.0.0.1", wandb_mode="offline")
    try:
        sdk = running.sdk(running.key_a)
        headers = {"Authorization": f"Bearer {running.key_a}"}
        assert httpx.post(f"{running.url}/v1/secrets", json={"name": "WANDB_API_KEY", "value": "local-key-0123"},
                          headers=headers).status_code in (200, 201)
        path = write_jsonl(tmp_path / "train.jsonl", [chat_example(fact) for fact in demo_facts(12, 0)])
        training = sdk.files.create(file=path.open("rb"), purpose="fine-tune").id
        job = sdk.fine_tuning.jobs.create(
            model="tiny-chat", training_file=training, seed=0,
            method={"type": "supervised", "supervised": {"hyperparameters": {**DEMO_HYPERPARAMETERS, "n_epochs": 2}}},
            integrations=[{"type": "wandb", "wandb": {"project": "support-bot", "tags": ["e2e"]}},
                          {"type": "mlflow", "mlflow": {"tracking_uri": mlflow_server, "experiment_name": "support",
                                                        "tags": {"team": "nlp"}}}])
        job = wait_for(sdk, job.id)
        assert job.status == "succeeded", job.error
        events = [e.message for e in sdk.fine_tuning.jobs.list_events(job.id, limit=100)]
        assert not [m for m in events if "integration" in m], events
        losses = {}
        for event in sdk.fine_tuning.jobs.list_events(job.id, limit=100):
            data = event.data or {}
            if event.type == "metrics" and "train_loss" in data:
                losses[int(data["step"])] = float(data["train_loss"])
        assert losses

        client = MlflowClient(tracking_uri=mlflow_server)
        experiment = client.get_experiment_by_name("support")
        [run] = client.search_runs([experiment.experiment_id], f"tags.`tuneforge.job_id` = '{job.id}'")
        assert run.info.status == "FINISHED" and run.data.tags["team"] == "nlp"
        assert run.data.params["n_epochs"] == "2"
        history = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "train/loss")}
        assert history.keys() == losses.keys()
        assert all(history[step] == pytest.approx(losses[step], rel=1e-5) for step in losses)
        assert run.data.metrics["final/steps"] == max(losses)

        with httpx.stream("GET", f"{running.url}/v1/fine_tuning/jobs/{job.id}/download?artifact=wandb",
                          headers=headers, timeout=60) as response:
            assert response.status_code == 200
            (tmp_path / "wandb.tar.gz").write_bytes(response.read())
        with tarfile.open(tmp_path / "wandb.tar.gz") as archive:
            archive.extractall(tmp_path / "wandb", filter="data")
        [path] = (tmp_path / "wandb").rglob("run-*.wandb")
        wandb_run = read_run(path)
        assert (wandb_run["id"], wandb_run["project"]) == (job.id, "support-bot")
        assert "e2e" in wandb_run["tags"] and f"tuneforge/{job.id}" in wandb_run["tags"]
        assert {step: values["train/loss"] for step, values in wandb_run["history"].items()} == pytest.approx(losses)
    finally:
        running.close()
