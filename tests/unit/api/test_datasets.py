"""Dataset checks through the API: reports, estimates, job-time validation."""

from __future__ import annotations

import csv
import io
import json

import openai
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from tests.helpers.files import upload_processed
from tests.helpers.platform import add_base_model, add_tenant, make_platform
from tests.unit.scheduler.test_loop import FakeExecutor
from tuneforge.api.app import create_app
from tuneforge.db.tables import Job
from tuneforge.scheduler.loop import Scheduler


def chat(i: int, answer: str | None = None) -> dict:
    return {"messages": [{"role": "user", "content": f"What is the code for item number {i} in the catalogue?"},
                         {"role": "assistant", "content": answer or f"The code for item {i} is K{i:04d}."}]}


def jsonl(rows) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


@pytest.fixture
def env(tmp_path, database_url, tiny_model_dir):
    platform = make_platform(tmp_path, database_url)
    add_base_model(platform, "tiny", tiny_model_dir)
    key, other = add_tenant(platform, "alpha"), add_tenant(platform, "beta")
    http = TestClient(create_app(platform=platform), raise_server_exceptions=False)
    sdk = openai.OpenAI(base_url="http://testserver/v1", api_key=key, http_client=http, max_retries=0)
    scheduler = Scheduler(platform, FakeExecutor(gpus=1))
    yield platform, http, sdk, {"Authorization": f"Bearer {key}"}, {"Authorization": f"Bearer {other}"}, scheduler
    http.close()
    platform.db.dispose()


def upload(sdk, data: bytes, name: str = "train.jsonl") -> str:
    return upload_processed(sdk, name, data).id


def test_csv_upload_is_processed_and_reported(env):
    _platform, http, sdk, auth, other, _ = env
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["prompt", "completion"])
    for i in range(12):
        writer.writerow([f"Question {i}, with a comma", f"Answer {i}"])
    file_id = upload(sdk, buffer.getvalue().encode(), "train.csv")
    assert sdk.files.retrieve(file_id).status == "processed"
    report = http.get(f"/v1/files/{file_id}/validation", headers=auth).json()
    assert report["ok"] is True and report["format"] == "csv" and report["kind"] == "instruction"
    assert report["num_examples"] == 12
    assert http.get(f"/v1/files/{file_id}/validation", headers=other).status_code == 404
    plain = sdk.files.create(file=("notes.txt", io.BytesIO(b"hello")), purpose="assistants").id
    missing = http.get(f"/v1/files/{plain}/validation", headers=auth)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "report_not_found"


def test_bad_line_is_named_in_status_and_report(env):
    _platform, http, sdk, auth, _other, _ = env
    rows = [chat(i) for i in range(12)]
    rows[6] = {"messages": [{"role": "assistant", "content": "hi"}, {"role": "user", "content": "x"}]}
    file_id = upload(sdk, jsonl(rows))
    created = sdk.files.retrieve(file_id)
    assert created.status == "error" and "line 7" in created.status_details
    report = http.get(f"/v1/files/{file_id}/validation", headers=auth).json()
    assert report["ok"] is False
    [(code, item)] = report["errors"].items()
    assert item["count"] == 1 and item["first"][0]["line"] == 7


def test_preference_data_for_supervised_is_a_shape_mismatch(env):
    _platform, _http, sdk, _auth, _other, _ = env
    rows = [{"prompt": f"q{i}", "chosen": f"good {i}", "rejected": f"bad {i}"} for i in range(12)]
    file_id = upload(sdk, jsonl(rows))
    with pytest.raises(openai.BadRequestError) as info:
        sdk.fine_tuning.jobs.create(model="tiny", training_file=file_id)
    assert info.value.body["code"] == "shape_mismatch" and info.value.body["param"] == "training_file"


def test_estimate_gives_figures_and_creates_nothing(env):
    platform, http, sdk, auth, _other, _ = env
    file_id = upload(sdk, jsonl([chat(i) for i in range(40)]))
    body = {"model": "tiny", "training_file": file_id,
            "method": {"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 2, "batch_size": 4}}}}
    estimate = http.post("/v1/fine_tuning/jobs/estimate", json=body, headers=auth)
    assert estimate.status_code == 200, estimate.text
    figures = estimate.json()
    assert figures["train_examples"] == 40 and figures["steps"] == 20
    assert figures["training_tokens"] == 2 * figures["train_tokens_per_epoch"] > 0
    assert figures["estimated_gpu_hours"] > 0 and figures["estimated_price"] > 0
    assert figures["queue_position"] == 1
    with platform.db.session() as session:
        assert session.scalar(select(func.count()).select_from(Job)) == 0


def test_validation_removes_duplicates_splits_and_reuses_the_prepared_dataset(env):
    _platform, http, sdk, auth, _other, scheduler = env
    rows = [chat(i) for i in range(30)] + [chat(3), chat(4)]  # two exact duplicates
    file_id = upload(sdk, jsonl(rows))
    body = {"model": "tiny", "training_file": file_id, "seed": 5,
            "data": {"remove_duplicates": True, "validation_split": 0.2}}
    first = http.post("/v1/fine_tuning/jobs", json=body, headers=auth).json()
    scheduler._validate_new_jobs()
    job = http.get(f"/v1/fine_tuning/jobs/{first['id']}", headers=auth).json()
    assert job["status"] == "queued", job
    data = job["data"]
    assert data["train_examples"] + data["valid_examples"] == 30
    assert 1 <= data["valid_examples"] <= 15
    assert job["estimate"]["training_tokens"] > 0
    report = http.get(f"/v1/fine_tuning/jobs/{first['id']}/validation", headers=auth).json()
    assert report["duplicates"]["counts"]["exact_duplicate"] == 2 and report["duplicates"]["removed"] == 2
    second = http.post("/v1/fine_tuning/jobs", json=body, headers=auth).json()
    scheduler._validate_new_jobs()
    events = http.get(f"/v1/fine_tuning/jobs/{second['id']}/events?limit=50", headers=auth).json()["data"]
    assert any(e["data"].get("reused_dataset") is True for e in events)
    assert (http.get(f"/v1/fine_tuning/jobs/{second['id']}", headers=auth).json()["data"]["dataset_id"]
            == data["dataset_id"])


def test_too_long_examples_fail_the_job_when_asked(env):
    _platform, http, sdk, auth, _other, scheduler = env
    rows = [chat(i) for i in range(12)]
    rows[9] = chat(9, answer="word " * 400)
    file_id = upload(sdk, jsonl(rows))
    body = {"model": "tiny", "training_file": file_id, "data": {"long_examples": "reject"},
            "method": {"type": "supervised", "supervised": {"hyperparameters": {"max_seq_length": 128}}}}
    job_id = http.post("/v1/fine_tuning/jobs", json=body, headers=auth).json()["id"]
    scheduler._validate_new_jobs()
    job = http.get(f"/v1/fine_tuning/jobs/{job_id}", headers=auth).json()
    assert job["status"] == "failed"
    assert job["error"]["code"] == "too_long" and job["error"]["param"] == "training_file"
    assert "line 10" in job["error"]["message"]


def test_pii_reject_policy_fails_with_the_line(env):
    _platform, http, sdk, auth, _other, scheduler = env
    rows = [chat(i) for i in range(12)]
    rows[4] = chat(4, answer="Write to jane.doe@example.com for the code.")
    file_id = upload(sdk, jsonl(rows))
    upload_report = http.get(f"/v1/files/{file_id}/validation", headers=auth).json()
    assert upload_report["ok"] is True and upload_report["pii"]["counts"]
    body = {"model": "tiny", "training_file": file_id, "data": {"pii_policy": "reject"}}
    job_id = http.post("/v1/fine_tuning/jobs", json=body, headers=auth).json()["id"]
    scheduler._validate_new_jobs()
    job = http.get(f"/v1/fine_tuning/jobs/{job_id}", headers=auth).json()
    assert job["status"] == "failed" and job["error"]["code"] == "pii_found" and "line 5" in job["error"]["message"]


def test_uploads_overlapping_a_platform_eval_set_are_flagged(env, tmp_path):
    platform, http, sdk, auth, _other, _ = env
    from tuneforge.services.training import eval_sets

    eval_item = ("Describe the procedure for calibrating the optical sensor array before the first measurement "
                 "run of the season, including the reference target and the tolerance that must be reached.")
    eval_path = tmp_path / "golden.jsonl"
    eval_path.write_text(json.dumps({"prompt": eval_item, "completion": "See the manual."}) + "\n")
    eval_sets.add_platform_eval_set(platform.store, "golden", eval_path)
    rows = [chat(i) for i in range(12)]
    rows[2] = {"messages": [{"role": "user", "content": eval_item}, {"role": "assistant", "content": "Sure."}]}
    rows[3] = {"messages": [{"role": "user", "content": "Describe the procedure for calibrating the optical "
                                                        "sensor quickly."}, {"role": "assistant", "content": "Ok."}]}
    file_id = upload(sdk, jsonl(rows))
    report = http.get(f"/v1/files/{file_id}/validation", headers=auth).json()
    assert report["contamination"]["counts"] == {"contamination": 1}
    assert report["contamination"]["first"][0]["line"] == 3
    assert report["contamination"]["first"][0]["source"] == "platform:golden"


def test_create_returns_the_same_figures_as_estimate(env):
    platform, http, sdk, auth, _other, scheduler = env
    file_id = upload(sdk, jsonl([chat(i) for i in range(40)]))
    body = {"model": "tiny", "training_file": file_id, "seed": 3,
            "method": {"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 2, "batch_size": 4}}}}
    figures = http.post("/v1/fine_tuning/jobs/estimate", json=body, headers=auth).json()
    created = http.post("/v1/fine_tuning/jobs", json=body, headers=auth)
    assert created.status_code == 200, created.text
    job = created.json()
    assert job["status"] == "queued"  # small files are validated within the request
    for key in ("training_tokens", "steps", "estimated_gpu_hours", "estimated_price", "train_examples"):
        assert job["estimate"][key] == figures[key], key
    assert job["data"]["dataset_id"] == figures["dataset_id"]

    # over the inline limit, the scheduler validates and the figures appear then
    platform.settings.inline_validation_max_bytes = 0
    later = http.post("/v1/fine_tuning/jobs", json=body, headers=auth).json()
    assert later["status"] == "validating_files" and later["estimate"] is None
    scheduler._validate_new_jobs()
    validated = http.get(f"/v1/fine_tuning/jobs/{later['id']}", headers=auth).json()
    assert validated["status"] == "queued"
    assert validated["estimate"]["training_tokens"] == figures["training_tokens"]


def test_create_with_bad_data_for_the_model_fails_the_job_at_once(env):
    _platform, http, sdk, auth, _other, _scheduler = env
    rows = [chat(i) for i in range(12)]
    rows[9] = chat(9, answer="word " * 400)
    file_id = upload(sdk, jsonl(rows))
    body = {"model": "tiny", "training_file": file_id, "data": {"long_examples": "reject"},
            "method": {"type": "supervised", "supervised": {"hyperparameters": {"max_seq_length": 128}}}}
    job = http.post("/v1/fine_tuning/jobs", json=body, headers=auth).json()
    assert job["status"] == "failed" and job["error"]["code"] == "too_long" and "line 10" in job["error"]["message"]
