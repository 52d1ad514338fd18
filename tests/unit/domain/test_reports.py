"""The trainer's reports as typed, bounded messages: text made safe and cut, never refused;
what no trainer sends (oversized, too deep, malformed identifiers) refused naming the field."""

from __future__ import annotations

import pytest

from tuneforge.domain import reports
from tuneforge.domain.reports import InvalidReport, parse


def _result(**fields) -> dict:
    return {"seq": 3, "attempt": 1, "adapter_prefix": "tenants/t/jobs/j/artifacts/adapter", **fields}


def test_eval_samples_with_nul_controls_and_surrogates_are_made_safe_not_refused() -> None:
    sample = {"prompt": "hi\ud800", "base": "\x00\x07", "fine_tuned": "ok\x1b[2J\x85"}
    message = parse("result", _result(eval={"samples": {"safety": [sample]}, "base": {"golden.loss": 1.0}}))
    [shown] = message.eval["samples"]["safety"]
    assert shown == {"prompt": "hi\ufffd", "base": "\\u0000\\u0007", "fine_tuned": "ok\\u001b[2J\\u0085"}
    assert message.eval["base"] == {"golden.loss": 1.0}


def test_a_long_sample_is_cut_with_a_marker_at_the_string_bound() -> None:
    message = parse("result", _result(eval={"samples": {"task": [{"fine_tuned": "z" * 50_000}]}}))
    text = message.eval["samples"]["task"][0]["fine_tuned"]
    assert len(text) <= reports.MAX_DATA_STRING_CHARS and text.endswith("more characters cut]")


def test_event_and_failure_messages_are_safe_and_bounded() -> None:
    events = parse("events", {"attempt": 1, "events": [{"seq": 1, "message": "\x00" * 10_000,
                                                         "data": {"answer": "\udc80"}}]})
    [event] = events.events
    assert len(event.message) <= reports.MAX_TEXT_CHARS and event.message.startswith("\\u0000")
    assert event.data == {"answer": "\ufffd"}
    failure = parse("failure", {"seq": 2, "attempt": 1, "message": "bad \x00", "param": "x\x07"})
    assert failure.message == "bad \\u0000" and failure.param == "x\\u0007"


@pytest.mark.parametrize(("kind", "body", "param", "reason"), [
    ("result", _result(adapter_prefix="a\x00b"), "adapter_prefix", "control characters"),
    ("result", _result(adapter_prefix="p" * (reports.MAX_IDENTIFIER_CHARS + 1)), "adapter_prefix", "at most"),
    ("checkpoints", {"seq": 1, "attempt": 1, "step": 1, "prefix": "p", "metrics": {"loss\x00": 1.0}},
     "metrics.loss\x00.[key]", "control characters"),
    ("failure", {"seq": 1, "attempt": 1, "code": "x" * 101}, "code", "at most 100"),
    ("events", {"attempt": 1, "events": [{"seq": 1, "data": {"k": [[[[[[[[[[[[[1]]]]]]]]]]]]]}}]},
     "events.0.data", "nested deeper than 12"),
    ("events", {"attempt": 1, "events": [{"seq": 1, "data": {str(i): i for i in range(3000)}}]},
     "events.0.data", "over the limit of 16384"),
    ("result", _result(eval={"errors": [{"message": "m" * 3000} for _ in range(400)]}), "eval",
     "over the limit of 1048576"),
    ("nonsense", {"attempt": 1}, "kind", "unknown report kind"),
])
def test_what_no_trainer_sends_is_refused_naming_the_field(kind, body, param, reason) -> None:
    with pytest.raises(InvalidReport) as refused:
        parse(kind, body)
    assert refused.value.param == param and reason in str(refused.value)
    assert refused.value.kind == kind


def test_a_report_over_the_report_bound_is_refused_before_it_is_parsed() -> None:
    body = {"attempt": 1, "events": [{"seq": i, "message": "x" * 3000} for i in range(1, 2000)]}
    with pytest.raises(InvalidReport, match=f"over the limit of {reports.MAX_REPORT_BYTES}"):
        parse("events", body)


def test_only_user_and_refused_report_failures_end_the_job_at_once() -> None:
    assert reports.FINAL_FAILURE_CLASSES == {"user", "report_refused"}
    assert parse("failure", {"seq": 1, "attempt": 1, "classification": "report_refused"}).classification == \
        "report_refused"
