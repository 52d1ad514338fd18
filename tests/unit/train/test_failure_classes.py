"""How the trainer classifies a failure: the tenant's input is `user` with a stable code and a
message free of host details; anything unexpected is `platform`; the traceback goes to the
trainer's log under the correlation id the report carries."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.helpers.tiny import stage_job
from tuneforge.domain.exit_codes import TrainerExit
from tuneforge.domain.reports import Failure
from tuneforge.domain.resolved import ResolvedEval
from tuneforge.train import evaluate, loop
from tuneforge.train.errors import UserInputError
from tuneforge.train.reporter import RecordingReporter
from tuneforge.train.runner import run_attempt


def _no_host_details(text: str) -> None:
    assert "Traceback" not in text and 'File "/' not in text
    assert "/work/" not in text and "site-packages" not in text and str(Path.home()) not in text


def test_unknown_lora_target_modules_are_the_tenants_mistake(tmp_path, tiny_model_dir, caplog) -> None:
    spec, store = stage_job(tmp_path, tiny_model_dir, lora={"target_modules": ["no_such_proj"]})
    reporter = RecordingReporter()
    with caplog.at_level(logging.ERROR, logger="tuneforge.train.runner"):
        assert run_attempt(spec, store, reporter) == TrainerExit.USER_ERROR
    [failure] = reporter.of_kind("failure")
    Failure.model_validate({**failure, "attempt": 1})  # what the control plane accepts
    assert failure["classification"] == "user" and failure["code"] == "invalid_target_modules"
    assert failure["param"] == "training_type.target_modules"
    assert "no_such_proj" in failure["message"] and "q_proj" in failure["message"]  # names valid ones
    _no_host_details(failure["message"])
    assert not reporter.of_kind("checkpoints") and not reporter.of_kind("result")
    # the operator's log has the whole story under the id the tenant sees
    [record] = [r for r in caplog.records if failure["correlation_id"] in r.getMessage()]
    assert record.exc_info is not None and "not found in the base model" in str(record.exc_info[1].__cause__)


def test_an_unexpected_error_is_the_platforms_and_keeps_its_traceback_in_the_log(
        tmp_path, tiny_model_dir, monkeypatch, caplog) -> None:
    spec, store = stage_job(tmp_path, tiny_model_dir)

    def broken(*_args, **_kwargs):
        raise RuntimeError(f"cannot map {tmp_path}/objects/shard-0 at <tuneforge.train.Run object at 0x7f3a2b>")

    monkeypatch.setattr(loop, "run_training", broken)
    reporter = RecordingReporter()
    with caplog.at_level(logging.ERROR, logger="tuneforge.train.runner"):
        assert run_attempt(spec, store, reporter) == TrainerExit.PLATFORM_ERROR
    [failure] = reporter.of_kind("failure")
    assert failure["classification"] == "platform" and failure["code"] == "platform_error"
    assert str(tmp_path) not in failure["message"] and "0x7f3a2b" not in failure["message"]
    _no_host_details(failure["message"])
    assert not reporter.events("message")  # no traceback event any more
    logged = caplog.text
    assert failure["correlation_id"] in logged and "Traceback" in logged and str(tmp_path) in logged


@pytest.mark.parametrize("detector", [{"type": "nonsense"}, "loud"])
def test_an_eval_config_the_trainer_cannot_use_is_the_tenants(tmp_path, tiny_model_dir, detector) -> None:
    spec, _store = stage_job(tmp_path, tiny_model_dir)
    run = SimpleNamespace(spec=replace(spec, eval=ResolvedEval(safety_detector=detector)),
                          reporter=RecordingReporter(), state=SimpleNamespace(step=3))
    with pytest.raises(UserInputError) as caught:
        evaluate.evaluate(run, validate=lambda _run: (0.0, 0.0))
    assert caught.value.code == "invalid_eval_config" and caught.value.param == "eval.safety_detector"


def test_an_eval_metric_past_its_deadline_fails_the_attempt_as_the_tenants(
        tmp_path, tiny_model_dir, monkeypatch) -> None:
    """A tenant's metric that hangs (here: any metric, with a deadline of 0 s) ends the attempt as a
    user error naming the metric: billed, not retried, no result (so no model) reported."""
    from tuneforge.eval import metrics as task_metrics
    from tuneforge.storage import layout

    spec, store = stage_job(tmp_path, tiny_model_dir)
    task_key = layout.file_key(spec.tenant_id, "file-task", "task.jsonl")
    store.put_bytes(task_key, b'{"prompt": "2+2=", "completion": "4"}\n{"prompt": "3+3=", "completion": "6"}\n')
    eval_config = ResolvedEval(task_file="file-task", task_file_key=task_key, golden=False, safety=False,
                               metrics=({"type": "regex", "pattern": r"(a+)+$"},), max_new_tokens=2, max_examples=2)
    monkeypatch.setattr(task_metrics, "METRIC_DEADLINE_S", 0.0)
    reporter = RecordingReporter()
    assert run_attempt(replace(spec, eval=eval_config), store, reporter) == TrainerExit.USER_ERROR
    [failure] = reporter.of_kind("failure")
    Failure.model_validate({**failure, "attempt": 1})
    assert failure["classification"] == "user" and failure["code"] == "eval_metric_timeout"
    assert failure["param"] == "eval.metrics" and "task.regex" in failure["message"]
    _no_host_details(failure["message"])
    assert not reporter.of_kind("result")
