"""The CLI over a running platform: `jobs create --follow` and `jobs follow` show the live loss
line and exit by the job's outcome; `jobs download` writes the adapter; `jobs export` writes a job
file that re-runs the job exactly (same configuration hash) and whose lock refuses other data."""

from __future__ import annotations

import json
import tarfile

import pytest
import yaml

from tests.e2e.conftest import start_plane
from tests.e2e.test_lifecycle import wait_for
from tests.helpers.cli import invoke
from tuneforge.cli.follow import loss_line
from tuneforge.demo.dataset import DEMO_HYPERPARAMETERS, chat_example, demo_facts, write_jsonl

pytestmark = [pytest.mark.e2e, pytest.mark.sqlite_pass_only]


def cli(*args: str, code: int = 0):  # noqa: ANN201
    done = invoke(*args)
    assert done.exit_code == code, (args, done.exit_code, done.stdout, done.stderr, done.exception)
    return done


def test_follow_download_and_an_exported_job_file_that_reruns_the_job(tmp_path, database_url, tiny_model_dir,
                                                                      monkeypatch):
    running = start_plane(tmp_path, database_url, tiny_model_dir)
    try:
        monkeypatch.setenv("TUNEFORGE_BASE_URL", f"{running.url}/v1")
        monkeypatch.setenv("TUNEFORGE_API_KEY", running.key_a)
        write_jsonl(tmp_path / "train.jsonl", [chat_example(fact) for fact in demo_facts(12, 0)])
        (tmp_path / "job.yaml").write_text(yaml.safe_dump({
            "model": "tiny-chat", "training_file": "file:train.jsonl",
            "method": {"type": "supervised", "supervised": {"hyperparameters": {
                **DEMO_HYPERPARAMETERS, "n_epochs": 3}}}}))
        created = cli("jobs", "create", "-f", str(tmp_path / "job.yaml"), "--follow")
        job_id = created.stdout.split("id: ")[1].split()[0]
        assert f"{job_id}: succeeded -> ft:tiny-chat:" in created.stderr
        assert "Fine-tuning job started" in created.stdout + created.stderr
        followed = cli("jobs", "follow", job_id, "--json")  # a finished job: its events, then the end
        events = [json.loads(line) for line in followed.stdout.splitlines()]
        metrics = [e["data"] for e in events if e["type"] == "metrics"]
        assert metrics and metrics[-1]["step"] == metrics[-1]["total_steps"]
        line = loss_line(metrics[-1])
        assert line.startswith(f"step {metrics[-1]['total_steps']}/{metrics[-1]['total_steps']}  loss ")

        cli("jobs", "download", job_id, "--artifact", "adapter", "-o", str(tmp_path / "adapter.tar.gz"))
        with tarfile.open(tmp_path / "adapter.tar.gz") as archive:
            assert any(name.endswith("adapter_model.safetensors") for name in archive.getnames())

        exported = cli("jobs", "export", job_id).stdout
        body = yaml.safe_load(exported)
        assert body["lock"]["exported_from"] == job_id and len(body["lock"]["base_model"]["sha256"]) == 64
        assert body["method"]["supervised"]["hyperparameters"]["batch_size"] == DEMO_HYPERPARAMETERS["batch_size"]
        (tmp_path / "again.yaml").write_text(exported)
        again = cli("jobs", "create", "-f", str(tmp_path / "again.yaml"), "--json")
        rerun_id = json.loads(again.stdout)["id"]
        sdk = running.sdk(running.key_a)
        rerun, first = wait_for(sdk, rerun_id), sdk.fine_tuning.jobs.retrieve(job_id)
        assert rerun.status == "succeeded", rerun.error
        assert rerun.model_extra["config_hash"] == first.model_extra["config_hash"]
        assert rerun.seed == first.seed

        # the lock: other data, or another base, is refused naming the field
        other = write_jsonl(tmp_path / "other.jsonl", [chat_example(fact) for fact in demo_facts(12, 3)])
        changed = dict(body, training_file=sdk.files.create(file=other.open("rb"), purpose="fine-tune").id)
        (tmp_path / "changed.yaml").write_text(yaml.safe_dump(changed))
        refused = cli("jobs", "create", "-f", str(tmp_path / "changed.yaml"), code=1)
        assert "code lock_mismatch" in refused.stderr and "field lock.training_file.sha256" in refused.stderr
        # a job that ends cancelled: follow exits 1
        cancelled = sdk.fine_tuning.jobs.create(model="tiny-chat", training_file=body["training_file"])
        sdk.fine_tuning.jobs.cancel(cancelled.id)
        ended = cli("jobs", "follow", cancelled.id, code=1)
        assert ended.stderr.strip().splitlines()[-1] == f"error: {cancelled.id} cancelled"
    finally:
        running.close()
