"""Jobs of every method through the API and the scheduler: data shape checks,
method defaults, and the spec the trainer gets."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.helpers.platform import add_base_model, add_tenant, chat_lines, make_platform
from tests.unit.scheduler.test_loop import FakeExecutor, _report
from tuneforge.api.app import create_app
from tuneforge.scheduler.loop import Scheduler


def _lines(records: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


PAIRS = _lines([{"input": {"messages": [{"role": "user", "content": f"question {i}"}]},
                 "preferred_output": [{"role": "assistant", "content": f"good answer {i}"}],
                 "non_preferred_output": [{"role": "assistant", "content": f"bad answer {i}"}]} for i in range(20)])
TEXT = _lines([{"text": f"document number {i} talks about rivers and stones at length."} for i in range(20)])


@pytest.fixture
def world(tmp_path, database_url, tiny_model_dir):
    platform = make_platform(tmp_path, database_url)
    add_base_model(platform, "tiny-base", tiny_model_dir)
    auth = {"Authorization": f"Bearer {add_tenant(platform, 'alpha')}"}
    http = TestClient(create_app(platform=platform))
    files = {name: http.post("/v1/files", files={"file": (f"{name}.jsonl", io.BytesIO(data))},
                             data={"purpose": "fine-tune"}, headers=auth).json()["id"]
             for name, data in (("chat", chat_lines(20)), ("pairs", PAIRS), ("text", TEXT))}
    executor = FakeExecutor(gpus=4)
    yield http, auth, files, Scheduler(platform, executor), executor
    http.close()
    platform.db.dispose()


@pytest.mark.parametrize("method,data,lr,beta", [("dpo", "pairs", 5e-5, 0.1), ("orpo", "pairs", 8e-5, 0.1),
                                                 ("cpt", "text", 1e-4, None), ("simpo", "pairs", 5e-5, 2.0)])
def test_each_method_is_validated_resolved_and_launched(world, method, data, lr, beta):
    http, auth, files, scheduler, executor = world
    body = {"model": "tiny-base", "training_file": files[data], "method": {"type": method}}
    created = http.post("/v1/fine_tuning/jobs", json=body, headers=auth)
    assert created.status_code == 200, created.text
    scheduler.tick()
    job = http.get(f"/v1/fine_tuning/jobs/{created.json()['id']}", headers=auth).json()
    assert job["status"] == "running", job.get("error")
    assert job["method"]["type"] == method
    hp = job["method"][method]["hyperparameters"]
    assert hp["learning_rate"] == pytest.approx(lr) and hp.get("beta") == pytest.approx(beta)  # cpt has none
    spec = executor.launched[-1]
    assert spec.method == method and spec.hyperparameters.method_options.get("beta") == pytest.approx(beta)


def test_a_method_with_the_wrong_data_shape_is_refused_at_creation(world):
    http, auth, files, _scheduler, _executor = world
    for method, data in (("dpo", "chat"), ("cpt", "pairs"), ("supervised", "text")):
        body = {"model": "tiny-base", "training_file": files[data], "method": {"type": method}}
        answer = http.post("/v1/fine_tuning/jobs", json=body, headers=auth)
        assert answer.status_code == 400, (method, data, answer.text)
        assert answer.json()["error"]["code"] == "shape_mismatch"
        assert answer.json()["error"]["param"] == "training_file"


def test_method_hyperparameters_are_checked_under_their_own_name(world):
    http, auth, files, _scheduler, _executor = world
    body = {"model": "tiny-base", "training_file": files["pairs"],
            "method": {"type": "dpo", "dpo": {"hyperparameters": {"beta": 0}}}}
    answer = http.post("/v1/fine_tuning/jobs", json=body, headers=auth)
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "method.dpo.hyperparameters.beta"
    body["method"] = {"type": "dpo", "dpo": {"hyperparameters": {"gamma": 1}}}
    answer = http.post("/v1/fine_tuning/jobs", json=body, headers=auth)
    assert answer.status_code == 400 and "gamma" in answer.json()["error"]["param"]
    body["method"] = {"type": "ppo"}
    answer = http.post("/v1/fine_tuning/jobs", json=body, headers=auth)
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "method.type"
    body["method"] = {"type": "reinforcement"}  # a reinforcement job needs its grader
    answer = http.post("/v1/fine_tuning/jobs", json=body, headers=auth)
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "method.reinforcement.grader"


def test_full_fine_tunes_are_admitted_and_qlora_is_refused_where_it_cannot_run(world):
    http, auth, files, scheduler, executor = world
    body = {"model": "tiny-base", "training_file": files["chat"], "training_type": {"type": "full"}}
    created = http.post("/v1/fine_tuning/jobs", json=body, headers=auth)
    assert created.status_code == 200, created.text
    scheduler.tick()
    job = http.get(f"/v1/fine_tuning/jobs/{created.json()['id']}", headers=auth).json()
    assert job["training_type"] == {"type": "full"}
    assert job["method"]["supervised"]["hyperparameters"]["learning_rate"] == pytest.approx(2e-5)
    assert executor.launched[-1].training_type == "full"
    # the finished job's artifact is the whole model
    spec = executor.launched[-1]
    prefix = f"tenants/{spec.tenant_id}/jobs/{spec.job_id}/artifacts/model"
    platform = scheduler.platform
    platform.store.put_bytes(f"{prefix}/model.safetensors", b"weights")
    platform.store.put_bytes(f"{prefix}/config.json", b"{}")
    results = f"tenants/{spec.tenant_id}/jobs/{spec.job_id}/results.csv"
    platform.store.put_bytes(results, b"step,train_loss\n")
    assert _report(http, spec, "result", {"seq": 1, "trained_tokens": 10, "adapter_prefix": prefix,
                                          "results_key": results}).status_code == 200
    archive = http.get(f"/v1/fine_tuning/jobs/{spec.job_id}/download", headers=auth)
    assert archive.status_code == 200
    with tarfile.open(fileobj=io.BytesIO(archive.content)) as tar:
        assert sorted(tar.getnames()) == [f"{spec.job_id}-model/config.json", f"{spec.job_id}-model/model.safetensors"]
    wrong = http.get(f"/v1/fine_tuning/jobs/{spec.job_id}/download?artifact=adapter", headers=auth)
    assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "artifact"
    if Path("/proc/driver/nvidia/version").exists():
        return  # a GPU host: QLoRA may well be available
    # no NVIDIA driver on this machine: a clear error at admission, nothing created
    before = len(http.get("/v1/fine_tuning/jobs", headers=auth).json()["data"])
    body["training_type"] = {"type": "qlora"}
    refused = http.post("/v1/fine_tuning/jobs", json=body, headers=auth)
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["code"] == "unsupported_training_type" and error["param"] == "training_type.type"
    assert "CUDA" in error["message"] and "bitsandbytes" in error["message"] and "'lora'" in error["message"]
    assert len(http.get("/v1/fine_tuning/jobs", headers=auth).json()["data"]) == before
