"""A report the control plane refuses ends the attempt once, with `report_refused`: in process
(refused mid-training, refused by its own type) and as a real trainer process whose result is
refused (exit 15 at once, not after the 120 s flush and three platform retries)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from tests.helpers.fake_control_plane import FakeControlPlane, default_answer
from tests.helpers.tiny import stage_job
from tests.unit.train.test_main import _finish, _start
from tuneforge.domain.exit_codes import TrainerExit
from tuneforge.domain.reports import Failure
from tuneforge.train.reporter import RecordingReporter
from tuneforge.train.runner import run_attempt


def test_a_checkpoint_report_refused_mid_training_ends_the_attempt_once(tmp_path, tiny_model_dir, caplog) -> None:
    spec, store = stage_job(tmp_path, tiny_model_dir, checkpoint={"every_steps": 2})
    reporter = RecordingReporter(refuse_kinds=("checkpoints",))
    with caplog.at_level(logging.ERROR, logger="tuneforge.train.runner"):
        assert run_attempt(spec, store, reporter) == TrainerExit.REPORT_REFUSED
    [failure] = reporter.of_kind("failure")
    Failure.model_validate(failure)
    assert failure["classification"] == "report_refused" and failure["code"] == "report_refused"
    assert failure["message"].startswith("The trainer's checkpoints report was refused by the control plane "
                                         "(HTTP 400): invalid checkpoints report: scripted refusal")
    assert not reporter.of_kind("result")
    steps = [e["data"]["step"] for e in reporter.events("metrics")]
    assert steps and max(steps) <= 3  # stopped at the next step, not trained to the end
    assert any(failure["correlation_id"] in r.getMessage() for r in caplog.records)


def test_a_report_its_own_type_refuses_ends_the_attempt_as_report_refused(tmp_path, tiny_model_dir) -> None:
    spec, store = stage_job(tmp_path, tiny_model_dir)
    reporter = RecordingReporter()
    report = reporter.report

    def with_a_broken_key(kind: str, body: dict) -> int:  # a trainer bug: a storage key holding NUL
        return report(kind, {**body, "results_key": "results\x00.csv"} if kind == "result" else body)

    reporter.report = with_a_broken_key
    assert run_attempt(spec, store, reporter) == TrainerExit.REPORT_REFUSED
    [failure] = reporter.of_kind("failure")
    assert failure["classification"] == "report_refused" and not reporter.of_kind("result")
    assert failure["message"].startswith("The trainer's result report was refused by its own check: invalid "
                                         "result report: results_key: must not contain control characters")


def test_a_refused_result_exits_15_at_once_and_says_why_on_both_sides(tmp_path: Path, tiny_model_dir: Path) -> None:
    refusal = {"error": {"message": "invalid result report: eval.samples: nope (error id err_1234abcd)",
                         "type": "invalid_request_error", "param": "eval", "code": "invalid_report"}}

    def answer(kind: str, body: dict) -> tuple[int, dict]:
        return (400, refusal) if kind == "result" else default_answer(kind, body)

    with FakeControlPlane(answer=answer) as plane:
        spec, _store = stage_job(tmp_path, tiny_model_dir, callback_url=plane.url)
        spec.write(tmp_path / "spec.json")
        started = time.monotonic()
        code, stderr = _finish(_start(tmp_path / "spec.json"))
        elapsed_s = time.monotonic() - started
    print(f"exit {code} after {elapsed_s:.1f} s")
    assert code == TrainerExit.REPORT_REFUSED, stderr[-3000:]
    assert elapsed_s < 100  # the old behaviour retried the result for 120 s before exiting 11
    assert sum(1 for r in plane.received if r.kind == "result") == 1
    [failure] = plane.accepted("failure")
    assert failure["classification"] == "report_refused"
    assert "result report was refused by the control plane (HTTP 400)" in failure["message"]
    assert "err_1234abcd" in stderr and "refused the result report (HTTP 400)" in stderr
    assert "exit 15 (report_refused)" in stderr
