"""What a tenant reads never carries the platform's internals: a trainer's traceback and the
host's paths stay in the operator's logs, under the correlation id the tenant's error shows."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from fastapi.testclient import TestClient

import tuneforge
from tests.unit.scheduler.test_loop import _report, setup  # noqa: F401 - the fixture
from tuneforge.api.app import create_app
from tuneforge.domain.exit_codes import TrainerExit
from tuneforge.executors.protocol import PollResult
from tuneforge.storage import layout

PACKAGE_DIR = str(Path(tuneforge.__file__).parent)
_TRACEBACK = f'''Traceback (most recent call last):
  File "{PACKAGE_DIR}/train/loop.py", line 212, in run_training
    run.step()
  File "{sys.prefix}/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1751, in _call_impl
    return forward_call(*args, **kwargs)
RuntimeError: shard {PACKAGE_DIR}/cache/shard-0.bin is gone (<tuneforge.train.loop.Run object at 0x7f1c2e3a>)'''


def _machine_paths(tmp_path: Path) -> list[str]:
    return [PACKAGE_DIR, sys.prefix, str(tmp_path), str(Path.home()) + "/", "/tmp/"]


def _tenant_views(http, auth, job_id) -> str:
    """Everything the tenant can read about the job, as one text."""
    views = [http.get(f"/v1/fine_tuning/jobs/{job_id}", headers=auth).json(),
             http.get(f"/v1/fine_tuning/jobs/{job_id}/events?limit=100", headers=auth).json(),
             http.get(f"/v1/fine_tuning/jobs/{job_id}/checkpoints", headers=auth).json(),
             http.get(f"/v1/fine_tuning/jobs/{job_id}/attempts", headers=auth).json()]
    return json.dumps(views)


def _assert_clean(text: str, tmp_path: Path) -> None:
    assert "Traceback" not in text and 'File \\"/' not in text and 'File "/' not in text
    assert "0x7f1c2e3a" not in text
    for path in _machine_paths(tmp_path):
        assert path not in text, path


def test_a_failure_report_with_a_traceback_and_paths_reaches_the_tenant_scrubbed(setup, tmp_path):  # noqa: F811
    platform, http, scheduler, executor, create_job, job, auth = setup
    job_id = create_job()
    scheduler.tick()
    spec = executor.launched[0]
    prefix = layout.checkpoint_prefix(spec.tenant_id, spec.job_id, 2)
    assert _report(http, spec, "checkpoints", {"seq": 1, "step": 2, "prefix": prefix,
                                               "metrics": {"train_loss": 1.5}}).status_code == 200
    assert _report(http, spec, "events", {"events": [
        {"seq": 2, "level": "error", "message": f"trainer error: {_TRACEBACK}", "data": {"traceback": _TRACEBACK,
                                                                                       "where": PACKAGE_DIR}},
    ]}).status_code == 200
    failure = {"seq": 3, "classification": "user", "code": "invalid_target_modules",
               "message": f"cannot adapt no_such_proj\n{_TRACEBACK}", "param": "training_type.target_modules",
               "correlation_id": "err_0123456789abcdef"}
    assert _report(http, spec, "failure", failure).status_code == 200
    executor.states[1] = PollResult("exited", int(TrainerExit.USER_ERROR))
    scheduler.tick()

    shown = job(job_id)
    assert shown["status"] == "failed"
    error = shown["error"]
    assert error["code"] == "invalid_target_modules" and error["param"] == "training_type.target_modules"
    assert error["correlation_id"] == "err_0123456789abcdef" and "cannot adapt no_such_proj" in error["message"]
    views = _tenant_views(http, auth, job_id)
    _assert_clean(views, tmp_path)
    events = http.get(f"/v1/fine_tuning/jobs/{job_id}/events?limit=100", headers=auth).json()["data"]
    assert any(e["data"].get("correlation_id") == "err_0123456789abcdef" for e in events)
    # the SDK reads the error in OpenAI's shape
    sdk_error = {k: error[k] for k in ("code", "message", "param")}
    assert all(isinstance(v, str) for v in sdk_error.values())


def test_a_users_mistake_is_not_retried_nor_refunded(setup):  # noqa: F811
    platform, http, scheduler, executor, create_job, job, auth = setup
    job_id = create_job()
    scheduler.tick()
    spec = executor.launched[0]
    _report(http, spec, "failure", {"seq": 1, "classification": "user", "code": "invalid_target_modules",
                                    "message": "no module named no_such_proj", "correlation_id": "err_00aa11bb"})
    executor.states[1] = PollResult("exited", int(TrainerExit.USER_ERROR))
    for _ in range(3):
        scheduler.tick()
    assert job(job_id)["status"] == "failed" and len(executor.launched) == 1
    attempts = http.get(f"/v1/fine_tuning/jobs/{job_id}/attempts", headers=auth).json()["data"]
    assert [a["failure_class"] for a in attempts] == ["user"]
    from tests.unit.scheduler.test_loop import attempt_of
    from tuneforge.services.tenancy.usage import is_refunded

    with platform.db.session() as session:
        assert not is_refunded(attempt_of(session, job_id, 1))


def test_platform_failures_are_retried_and_the_last_one_carries_its_correlation_id(setup, tmp_path, caplog):  # noqa: F811
    platform, http, scheduler, executor, create_job, job, auth = setup
    job_id = create_job()
    scheduler.tick()
    for number in range(1, platform.settings.max_attempt_failures + 1):
        spec = executor.launched[number - 1]
        reply = _report(http, spec, "failure", {
            "seq": 1, "classification": "platform", "code": "platform_error",
            "message": f"internal error at {PACKAGE_DIR}/train/loop.py\n{_TRACEBACK}",
            "correlation_id": f"err_{number:016x}"})
        assert reply.status_code == 200
        assert job(job_id)["status"] == "running"  # a platform fault waits for the exit
        executor.states[number] = PollResult("exited", int(TrainerExit.PLATFORM_ERROR))
        with caplog.at_level(logging.ERROR):
            scheduler.tick()
    shown = job(job_id)
    assert shown["status"] == "failed" and shown["error"]["code"] == "platform_error"
    last = f"err_{platform.settings.max_attempt_failures:016x}"
    assert shown["error"]["correlation_id"] == last and last in shown["error"]["message"]
    _assert_clean(_tenant_views(http, auth, job_id), tmp_path)


def test_a_trainer_that_dies_without_a_report_fails_with_an_id_not_its_log(setup, tmp_path, caplog):  # noqa: F811
    platform, http, scheduler, executor, create_job, job, auth = setup
    executor.log_tail = lambda handle, max_bytes=4000: _TRACEBACK
    job_id = create_job()
    scheduler.tick()
    executor.states[1] = PollResult("exited", int(TrainerExit.USER_ERROR))
    with caplog.at_level(logging.ERROR, logger="tuneforge.scheduler"):
        scheduler.tick()
    error = job(job_id)["error"]
    assert error["correlation_id"].startswith("err_") and error["correlation_id"] in error["message"]
    _assert_clean(_tenant_views(http, auth, job_id), tmp_path)
    assert error["correlation_id"] in caplog.text and "Traceback" in caplog.text  # the operator has it


def test_the_500_envelope_carries_a_request_id_and_no_exception_text(setup, caplog):  # noqa: F811
    platform = setup[0]
    app = create_app(platform=platform)

    def broken() -> None:
        raise RuntimeError(f"database at {PACKAGE_DIR}/secret.db is locked")

    app.add_api_route("/v1/broken", broken)
    with TestClient(app, raise_server_exceptions=False) as http, caplog.at_level(logging.ERROR):
        response = http.get("/v1/broken")
    assert response.status_code == 500
    error = response.json()["error"]
    request_id = response.headers["X-Request-Id"]
    assert request_id.startswith("req_") and f"request id {request_id}" in error["message"]
    assert error["type"] == "server_error" and error["code"] == "internal_error"
    assert "RuntimeError" not in response.text and "locked" not in response.text and PACKAGE_DIR not in response.text
    assert request_id in caplog.text and "locked" in caplog.text


def test_target_modules_are_checked_against_the_base_model_at_creation(setup):  # noqa: F811
    _platform, http, _scheduler, _executor, create_job, _job, auth = setup
    file_id = http.get("/v1/files", headers=auth).json()["data"][0]["id"]
    body = {"model": "tiny-base", "training_file": file_id,
            "method": {"type": "supervised", "supervised": {"hyperparameters": {}}},
            "training_type": {"type": "lora", "target_modules": ["no_such_proj"]}}
    refused = http.post("/v1/fine_tuning/jobs", json=body, headers=auth)
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["param"] == "training_type.target_modules" and error["code"] == "invalid_target_modules"
    assert "no_such_proj" in error["message"] and "q_proj" in error["message"]
    create_job(training_type={"type": "lora", "target_modules": ["q_proj", "self_attn.v_proj"]})
