"""HttpReporter against a fake control plane: order, retry, fencing, stop."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from tests.helpers.fake_control_plane import FakeControlPlane, default_answer
from tests.helpers.net import free_port
from tuneforge.train.reporter import (
    HttpReporter,
    RecordingReporter,
    message_event,
    metrics_event,
)


def _reporter(url: str, **options: Any) -> HttpReporter:
    options = {"heartbeat_interval_s": 0.1, "initial_backoff_s": 0.05, "max_backoff_s": 0.2, **options}
    return HttpReporter(url, "ftjob-1", 3, "secret-token", **options).start()


def _wait_for(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_reports_arrive_in_order_with_increasing_seq_and_the_attempt() -> None:
    with FakeControlPlane() as plane:
        reporter = _reporter(plane.url)
        for step in range(1, 6):
            reporter.progress(step, 5)
            reporter.report("events", metrics_event({"step": step, "train_loss": 1.0 / step}))
        reporter.report("checkpoints", {"step": 5, "prefix": "p", "metrics": {}})
        reporter.report("result", {"trained_tokens": 10, "adapter_prefix": "a", "results_key": "r", "metrics": {}})
        assert reporter.flush(5.0)
        _wait_for(lambda: plane.accepted("heartbeat"))
        reporter.close()
    events = plane.accepted_events()
    assert [event["data"]["step"] for event in events] == [1, 2, 3, 4, 5]
    seqs = [event["seq"] for event in events]
    seqs += [plane.accepted("checkpoints")[0]["seq"], plane.accepted("result")[0]["seq"]]
    assert seqs == [1, 2, 3, 4, 5, 6, 7]
    reports = [r for r in plane.received if r.kind != "heartbeat"]
    assert all(r.body["attempt"] == 3 for r in plane.received)
    assert all(r.authorization == "Bearer secret-token" for r in plane.received)
    assert len(reports) < 7  # consecutive events travel in one request
    assert {"step", "total_steps"} <= set(plane.accepted("heartbeat")[0])


def test_reports_are_retried_until_the_control_plane_is_back() -> None:
    failures = {"left": 3}
    lock = threading.Lock()

    def flaky(kind: str, body: dict) -> tuple[int, dict]:
        with lock:
            if kind != "heartbeat" and failures["left"] > 0:
                failures["left"] -= 1
                return 503, {"error": "busy"}
        return default_answer(kind, body)

    with FakeControlPlane(answer=flaky) as plane:
        reporter = _reporter(plane.url)
        reporter.report("events", message_event("one"))
        reporter.report("events", message_event("two"))
        reporter.report("failure", {"code": "x", "message": "y"})
        assert reporter.flush(10.0)
        reporter.close()
    assert [event["message"] for event in plane.accepted_events()] == ["one", "two"]
    assert [body["seq"] for body in plane.accepted("failure")] == [3]
    assert sum(1 for r in plane.received if r.status == 503) == 3


@pytest.mark.parametrize("status", [409, 401])
def test_409_or_401_fences_the_attempt(status: int) -> None:
    with FakeControlPlane(answer=lambda kind, body: (status, {"error": {"code": "stale_attempt"}})) as plane:
        reporter = _reporter(plane.url)
        reporter.report("events", message_event("hello"))
        _wait_for(lambda: reporter.fenced)
        assert reporter.flush(1.0) is False
        sent = len(plane.received)
        reporter.report("events", message_event("after fencing"))
        time.sleep(0.3)
        reporter.close()
        assert len(plane.received) == sent  # nothing more goes out


def test_heartbeat_stop_action_requests_a_stop() -> None:
    def cancelled(kind: str, body: dict) -> tuple[int, dict]:
        return 200, ({"action": "stop"} if kind == "heartbeat" else {"ok": True})

    with FakeControlPlane(answer=cancelled) as plane:
        reporter = _reporter(plane.url)
        _wait_for(lambda: reporter.stop_requested)
        reporter.close()
    assert not reporter.fenced


def test_flush_gives_up_when_the_control_plane_is_away() -> None:
    reporter = _reporter(f"http://127.0.0.1:{free_port()}", request_timeout_s=0.5)
    reporter.report("events", message_event("nobody listens"))
    started = time.monotonic()
    assert reporter.flush(0.5) is False
    assert time.monotonic() - started < 2.0
    reporter.close()


def test_recording_reporter_scripts_stop_and_fence() -> None:
    reporter = RecordingReporter(stop_at_step=2, fence_at_step=3)
    reporter.progress(1, 4)
    assert not reporter.stop_requested
    reporter.progress(2, 4)
    assert reporter.stop_requested and not reporter.fenced
    reporter.progress(3, 4)
    assert reporter.fenced and reporter.flush(1.0) is False
    with pytest.raises(ValueError):
        reporter.report("bogus", {})


def test_non_finite_numbers_travel_as_null() -> None:
    with FakeControlPlane() as plane:
        reporter = _reporter(plane.url)
        reporter.report("events", metrics_event({"step": 1, "valid_loss": float("nan"), "grad_norm": float("inf")}))
        assert reporter.flush(5.0)
        reporter.close()
    data = plane.accepted_events()[0]["data"]
    assert data["valid_loss"] is None and data["grad_norm"] is None and data["step"] == 1


# ---- a report the control plane refuses is final, not retried -------------------------------------

def _refusing(kind_refused: str, status: int = 400):
    def answer(kind: str, body: dict) -> tuple[int, dict]:
        if kind == kind_refused:
            return status, {"error": {"message": "invalid result report: eval: is too big (error id err_00c0ffee)",
                                      "type": "invalid_request_error", "param": "eval", "code": "invalid_report"}}
        return default_answer(kind, body)
    return answer


@pytest.mark.parametrize("status", [400, 413, 422, 404])
def test_a_refused_report_is_sent_once_logged_with_its_reason_and_only_a_failure_follows(status, caplog) -> None:
    with FakeControlPlane(answer=_refusing("result", status)) as plane:
        reporter = _reporter(plane.url)
        reporter.report("result", {"trained_tokens": 1, "adapter_prefix": "a", "metrics": {}})
        reporter.report("events", message_event("after the result"))
        started = time.monotonic()
        with caplog.at_level("ERROR", logger="tuneforge.train.reporter"):
            assert reporter.flush(10.0)  # nothing left to deliver: the refused report is dropped, not retried
        assert time.monotonic() - started < 5.0
        refusal = reporter.refusal
        assert refusal is not None and refusal.kind == "result" and refusal.status == status
        assert "err_00c0ffee" in refusal.reason and "is too big" in refusal.reason
        assert any("refused the result report" in r.getMessage() and "err_00c0ffee" in r.getMessage()
                   for r in caplog.records)
        reporter.report("events", message_event("dropped: the attempt is ending"))
        reporter.report("failure", {"classification": "report_refused", "code": "report_refused", "message": "m"})
        assert reporter.flush(5.0)
        assert not reporter.fenced
        reporter.close()
    assert sum(1 for r in plane.received if r.kind == "result") == 1
    assert not plane.accepted("events") and len(plane.accepted("failure")) == 1


@pytest.mark.parametrize("status", [429, 408, 503])
def test_busy_answers_are_retried_not_taken_as_refusals(status) -> None:
    answers = {"left": 2}

    def busy(kind: str, body: dict) -> tuple[int, dict]:
        if kind == "result" and answers["left"] > 0:
            answers["left"] -= 1
            return status, {"error": {"message": "busy"}}
        return default_answer(kind, body)

    with FakeControlPlane(answer=busy) as plane:
        reporter = _reporter(plane.url)
        reporter.report("result", {"trained_tokens": 1, "adapter_prefix": "a", "metrics": {}})
        assert reporter.flush(10.0) and reporter.refusal is None
        reporter.close()
    assert len(plane.accepted("result")) == 1 and sum(1 for r in plane.received if r.kind == "result") == 3


def test_reports_leave_the_trainer_sanitised_and_bounded() -> None:
    with FakeControlPlane() as plane:
        reporter = _reporter(plane.url)
        reporter.report("events", message_event("model said \x00\x1b", data={"sample": "\ud800" + "a" * 9000}))
        reporter.report("result", {"trained_tokens": 1, "adapter_prefix": "a", "metrics": {},
                                   "eval": {"samples": {"safety": [{"fine_tuned": "\x00"}]}}})
        assert reporter.flush(5.0)
        reporter.close()
    [event] = plane.accepted_events()
    assert event["message"] == "model said \\u0000\\u001b"
    assert event["data"]["sample"].startswith("\ufffdaaa") and event["data"]["sample"].endswith("characters cut]")
    assert plane.accepted("result")[0]["eval"]["samples"]["safety"] == [{"fine_tuned": "\\u0000"}]


def test_a_report_its_type_refuses_raises_in_the_trainer_before_it_is_queued() -> None:
    from tuneforge.train.errors import ReportRefused

    reporter = RecordingReporter()
    with pytest.raises(ReportRefused, match="adapter_prefix: must not contain control characters") as refused:
        reporter.report("result", {"trained_tokens": 1, "adapter_prefix": "a\x00", "metrics": {}})
    assert refused.value.kind == "result" and refused.value.status is None
    assert not reporter.reports
