"""/internal/v1 reports with a model's own text in them, and reports the control plane refuses:
text is stored and shown safely; a refusal is logged with an id, fails the job once with
`report_refused` (not retried, billed), and the trainer's exit 15 does the same without a report."""

from __future__ import annotations

import json
import logging

from tests.unit.scheduler.test_loop import attempt_of, setup  # noqa: F401 - the fixture
from tuneforge.domain.exit_codes import TrainerExit
from tuneforge.executors.protocol import PollResult
from tuneforge.services.tenancy.usage import is_refunded

MODEL_TEXT = "ok\x00\x07\x1b[2J\x85\ud800 end"
SAFE_MODEL_TEXT = "ok\\u0000\\u0007\\u001b[2J\\u0085\ufffd end"


def _post(http, spec, kind, body):
    # ensure_ascii: a lone surrogate travels as the JSON escape a trainer's JSON encoder would write
    return http.post(f"/internal/v1/jobs/{spec.job_id}/{kind}",
                     content=json.dumps({"attempt": spec.attempt, **body}).encode(),
                     headers={"Authorization": f"Bearer {spec.job_token}", "Content-Type": "application/json"})


def _started(setup):  # noqa: F811
    platform, http, scheduler, executor, create_job, job, auth = setup
    job_id = create_job(suffix="safe")
    scheduler.tick()
    return job_id, executor.launched[0]


def test_eval_samples_and_events_with_model_bytes_are_stored_and_shown_safely(setup):  # noqa: F811
    platform, http, _scheduler, _executor, _create, job, auth = setup
    job_id, spec = _started(setup)
    event = {"seq": 1, "message": f"sample: {MODEL_TEXT}", "data": {"answer": MODEL_TEXT}}
    assert _post(http, spec, "events", {"events": [event]}).json() == {"applied": 1}
    adapter = f"tenants/{spec.tenant_id}/jobs/{job_id}/artifacts/adapter"
    samples = {"safety": [{"prompt": "p", "base": "no", "fine_tuned": MODEL_TEXT}]}
    answer = _post(http, spec, "result", {"seq": 2, "adapter_prefix": adapter,
                                          "eval": {"base": {}, "fine_tuned": {}, "samples": samples}})
    assert answer.status_code == 200, answer.text
    done = job(job_id)
    assert done["status"] == "succeeded"
    with platform.db.session() as session:
        stored = attempt_of(session, job_id, 1).result["eval"]["samples"]["safety"][0]["fine_tuned"]
    assert stored == SAFE_MODEL_TEXT
    events = http.get(f"/v1/fine_tuning/jobs/{job_id}/events?limit=100", headers=auth)
    shown = [e for e in events.json()["data"] if e["message"].startswith("sample:")]
    assert shown[0]["message"] == f"sample: {SAFE_MODEL_TEXT}" and shown[0]["data"]["answer"] == SAFE_MODEL_TEXT
    events.content.decode("utf-8")  # valid UTF-8 JSON all the way out


def test_a_refused_report_is_logged_with_an_id_and_fails_the_job_once_without_a_retry(setup, caplog):  # noqa: F811
    platform, http, scheduler, executor, _create, job, _auth = setup
    job_id, spec = _started(setup)
    with caplog.at_level(logging.WARNING, logger="tuneforge.services.training.reports"):
        refused = _post(http, spec, "result", {"seq": 1, "adapter_prefix": "bad\x00prefix"})
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["code"] == "invalid_report" and error["param"] == "adapter_prefix"
    assert "invalid result report: adapter_prefix" in error["message"] and "error id err_" in error["message"]
    error_id = error["message"].rsplit("error id ", 1)[1].rstrip(")")
    [logged] = [r.getMessage() for r in caplog.records if error_id in r.getMessage()]
    assert f"refused the result report of {job_id} attempt 1" in logged and "adapter_prefix" in logged
    # the trainer then says so once, and exits 15
    failure = {"seq": 2, "classification": "report_refused", "code": "report_refused",
               "message": "The control plane refused the trainer's result report (HTTP 400): ...",
               "correlation_id": "err_0123456789abcdef"}
    assert _post(http, spec, "failure", failure).status_code == 200
    executor.states[1] = PollResult("exited", int(TrainerExit.REPORT_REFUSED))
    scheduler.tick()
    scheduler.tick()
    failed = job(job_id)
    assert failed["status"] == "failed" and failed["error"]["code"] == "report_refused"
    assert "result report" in failed["error"]["message"] and "err_0123456789abcdef" in failed["error"]["message"]
    assert len(executor.launched) == 1  # not retried
    with platform.db.session() as session:
        attempt = attempt_of(session, job_id, 1)
        assert attempt.failure_class == "report_refused" and attempt.status == "failed"
        assert not is_refunded(attempt)  # billed: the job fails instead of costing retries


def test_exit_15_without_a_failure_report_still_fails_the_job_at_once(setup):  # noqa: F811
    platform, _http, scheduler, executor, _create, job, _auth = setup
    job_id, _spec = _started(setup)
    executor.states[1] = PollResult("exited", int(TrainerExit.REPORT_REFUSED))
    scheduler.tick()
    scheduler.tick()
    failed = job(job_id)
    assert failed["status"] == "failed" and failed["error"]["code"] == "report_refused"
    assert len(executor.launched) == 1
    with platform.db.session() as session:
        assert attempt_of(session, job_id, 1).failure_class == "report_refused"


def test_a_report_without_a_valid_token_is_refused_before_its_body_is_parsed(setup, caplog):  # noqa: F811
    _platform, http, _scheduler, _executor, _create, _job, _auth = setup
    job_id, spec = _started(setup)
    with caplog.at_level(logging.WARNING, logger="tuneforge.services.training.reports"):
        forged = http.post(f"/internal/v1/jobs/{job_id}/result", json={"attempt": 1, "adapter_prefix": "x\x01"},
                           headers={"Authorization": "Bearer not-the-token"})
        no_attempt = http.post(f"/internal/v1/jobs/{job_id}/result", json={"adapter_prefix": "x"},
                               headers={"Authorization": f"Bearer {spec.job_token}"})
    assert forged.status_code == 401
    assert no_attempt.status_code == 400 and no_attempt.json()["error"]["param"] == "attempt"
    assert not [r for r in caplog.records if "refused the" in r.getMessage()]  # nothing logged for either
