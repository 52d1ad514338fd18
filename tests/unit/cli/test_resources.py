"""The CLI against a live server on 127.0.0.1: every resource, `--json` output that parses, job
files with `file:` references, and one-line errors with the documented exit codes."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.compat.conftest import start_live
from tests.helpers.cli import invoke
from tests.helpers.platform import chat_lines
from tuneforge import __version__


@pytest.fixture
def live(tmp_path, database_url, tiny_model_dir, monkeypatch):
    world = start_live(tmp_path, database_url, tiny_model_dir, admin_api_key="admin-key-0123456789")
    monkeypatch.setenv("TUNEFORGE_BASE_URL", f"{world.url}/v1")
    monkeypatch.setenv("TUNEFORGE_API_KEY", world.key_a)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    yield world
    world.plane.close()


def cli(*args: str, input: str | None = None, code: int = 0):  # noqa: A002
    done = invoke(*args, input=input)
    assert done.exit_code == code, (args, done.exit_code, done.stdout, done.stderr, done.exception)
    return done


def as_json(*args: str):  # noqa: ANN201
    return json.loads(cli(*args, "--json").stdout)


def test_files_round_trip_with_json_output(live, tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_bytes(chat_lines(20))
    created = as_json("files", "upload", str(path))
    assert created["object"] == "file" and created["bytes"] == path.stat().st_size and created["status"] == "processed"
    assert as_json("files", "get", created["id"])["filename"] == "train.jsonl"
    assert [f["id"] for f in as_json("files", "list")["data"]] == [created["id"]]
    assert as_json("files", "report", created["id"])["num_examples"] == 20
    preview = as_json("files", "preview", created["id"], "--model", "tiny-base", "--limit", "1")
    assert preview["examples"][0]["num_trained_tokens"] > 0
    human = cli("files", "preview", created["id"], "--model", "tiny-base", "--limit", "1").stdout
    assert "line 1:" in human and "trained" in human
    cli("files", "download", created["id"], "-o", str(tmp_path / "copy.jsonl"))
    assert (tmp_path / "copy.jsonl").read_bytes() == path.read_bytes()
    assert as_json("files", "delete", created["id"])["deleted"] is True
    assert as_json("files", "list")["data"] == []


def test_jobs_from_options_and_from_a_job_file(live, tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_bytes(chat_lines(20))
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump({
        "model": "tiny-base", "training_file": "file:data/train.jsonl", "suffix": "from-file", "seed": 7,
        "metadata": {"team": "nlp"},
        "method": {"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 2}}}}))
    estimate = as_json("jobs", "estimate", "-f", str(job_file))
    assert estimate["estimated_steps"] > 0 if "estimated_steps" in estimate else estimate
    job = as_json("jobs", "create", "-f", str(job_file))
    assert (job["model"], job["user_provided_suffix"], job["seed"]) == ("tiny-base", "from-file", 7)
    assert job["training_file"].startswith("file-")  # the file: path was uploaded
    uploaded = as_json("files", "get", job["training_file"])
    assert uploaded["filename"] == "train.jsonl"

    other = as_json("jobs", "create", "--model", "tiny-base", "--training-file", job["training_file"],
                    "-H", "n_epochs=3", "--learning-rate", "0.001")
    assert other["method"]["supervised"]["hyperparameters"]["n_epochs"] == 3
    listed = as_json("jobs", "list")["data"]
    assert [j["id"] for j in listed] == [other["id"], job["id"]]
    assert [j["id"] for j in as_json("jobs", "list", "--metadata", "team=nlp")["data"]] == [job["id"]]
    assert as_json("jobs", "get", job["id"])["id"] == job["id"]
    assert as_json("jobs", "cancel", other["id"])["status"] == "cancelled"
    events = as_json("jobs", "events", job["id"])["data"]
    assert any(e["message"].startswith("Created fine-tuning job") for e in events)
    assert as_json("events", job["id"])["data"] == events
    assert as_json("checkpoints", job["id"])["data"] == []
    shown = cli("jobs", "get", job["id"]).stdout
    assert f"id: {job['id']}" in shown and "status:" in shown


def test_a_training_api_checkpoint_is_registered_and_downloaded_from_the_cli(live, tmp_path):
    import tarfile

    from tests.helpers.training_api import saved_training_checkpoint, tenant_named

    platform = live.plane.platform
    path = saved_training_checkpoint(platform, "tiny-base", tenant_named(platform, "acme"), "loop",
                                     time="2026-11-30T00:00:00Z")
    model = as_json("models", "register", path, "--suffix", "cli")
    assert model["id"].startswith("ft:tiny-base:acme:cli:") and model["job_id"] is None
    assert f"trained through the training API: {path}" in cli("models", "get", model["id"]).stdout
    cli("models", "download", model["id"], "-o", str(tmp_path / "adapter.tar.gz"))
    with tarfile.open(tmp_path / "adapter.tar.gz") as archive:
        assert sorted(n.rsplit("/", 1)[1] for n in archive.getnames()) == ["adapter_config.json",
                                                                            "adapter_model.safetensors"]
    refused = cli("models", "register", "tinker://nothing/weights/here", code=1)
    assert "not found" in refused.stderr


def test_models_webhooks_secrets_usage_and_keys(live):
    models = as_json("models", "list")["data"]
    assert "tiny-base" in [m["id"] for m in models]
    assert as_json("models", "get", "tiny-base")["type"] == "base"

    hook = as_json("webhooks", "create", "https://93.184.216.34/hook", "--event", "fine_tuning.job.succeeded")
    assert hook["secret"] and hook["events"] == ["fine_tuning.job.succeeded"]
    assert [h["id"] for h in as_json("webhooks", "list")["data"]] == [hook["id"]]
    updated = as_json("webhooks", "update", hook["id"], "--event", "fine_tuning.job.failed")
    assert updated["events"] == ["fine_tuning.job.failed"] and "secret" not in updated
    assert as_json("webhooks", "deliveries", hook["id"])["data"] == []
    cli("webhooks", "delete", hook["id"])
    assert as_json("webhooks", "list")["data"] == []

    cli("secrets", "set", "WANDB_API_KEY", input="local-key-123\n")
    listed = as_json("secrets", "list")
    assert [s["name"] for s in listed["data"]] == ["WANDB_API_KEY"] and "local-key-123" not in json.dumps(listed)
    cli("secrets", "delete", "WANDB_API_KEY")
    assert as_json("secrets", "list")["data"] == []

    usage = as_json("usage")
    assert usage["object"] == "list" and "totals" in usage

    cli("keys", "list", "acme", code=2)  # no admin key given
    import os

    os.environ["TUNEFORGE_ADMIN_API_KEY"] = "admin-key-0123456789"
    try:
        created = as_json("keys", "create", "acme", "--name", "ci")
        assert created["api_key"].startswith("tf-")
        assert created["id"] in [k["id"] for k in as_json("keys", "list", "acme")["data"]]
        assert as_json("keys", "revoke", "acme", created["id"])["revoked_at"]
    finally:
        del os.environ["TUNEFORGE_ADMIN_API_KEY"]


def test_failures_are_one_line_with_their_exit_code(live, monkeypatch):
    assert cli("--version").stdout.strip() == f"tuneforge {__version__}"
    missing = cli("jobs", "get", "ftjob-nope", code=1)
    assert missing.stderr.count("\n") == 1 and missing.stderr.startswith("error: HTTP 404:")
    assert "Traceback" not in missing.stderr + missing.stdout
    refused = cli("jobs", "create", "--model", "no-such-model", "--training-file", "file-x", code=1)
    assert "field " in refused.stderr and refused.stderr.count("\n") == 1
    monkeypatch.setenv("TUNEFORGE_API_KEY", "tf-wrong")
    assert cli("files", "list", code=1).stderr.startswith("error: HTTP 401:")
    monkeypatch.setenv("TUNEFORGE_BASE_URL", "http://127.0.0.1:9")  # nothing listens; /v1 is added
    down = cli("files", "list", code=3)
    assert down.stderr == ("error: cannot reach the tuneforge server at http://127.0.0.1:9/v1 (connection refused); "
                           "set TUNEFORGE_BASE_URL to its /v1 URL\n")
    monkeypatch.delenv("TUNEFORGE_API_KEY")
    monkeypatch.setenv("OPENAI_API_KEY", live.key_a)  # the openai SDK's variables work too
    monkeypatch.delenv("TUNEFORGE_BASE_URL")
    monkeypatch.setenv("OPENAI_BASE_URL", f"{live.url}/v1")
    assert as_json("files", "list")["object"] == "list"
    monkeypatch.delenv("OPENAI_API_KEY")
    assert cli("files", "list", code=2).stderr.startswith("error: set TUNEFORGE_API_KEY")
