"""A tenant's task metric is bounded: RE2 patterns (linear time, checked at create), a deadline
over the answers, and any failure is a `MetricFailed` naming the metric (the tenant's fault)."""

from __future__ import annotations

import pytest

from tuneforge.domain.errors import ApiError
from tuneforge.eval import metrics
from tuneforge.eval.metrics import MetricFailed, aggregate, parse_metrics

# 30 'a's then '!': Python's re backtracks 2^30 times on (a+)+$ before giving up
EVIL = r"(a+)+$"
EVIL_ANSWER = "a" * 30 + "!"


def test_a_catastrophic_pattern_is_linear_under_re2() -> None:
    [spec] = parse_metrics([{"type": "regex", "pattern": EVIL}])
    assert aggregate([spec], [EVIL_ANSWER, "aaaa"], ["", ""]) == {"task.regex": 0.5}


@pytest.mark.parametrize("pattern, words", [
    (r"(a)\1", "backreferences"),  # RE2 cannot run backreferences: refused at create
    (r"(?=a)a", "lookaround"),
    ("a" * (metrics.MAX_PATTERN_CHARS + 1), f"longer than {metrics.MAX_PATTERN_CHARS} characters"),
    ("(" * 400 + ")" * 400 + "{1000}" * 3, "RE2"),  # blows the automaton's memory bound
])
def test_patterns_re2_cannot_run_are_a_400_at_create(pattern: str, words: str) -> None:
    with pytest.raises(ApiError) as caught:
        parse_metrics(["exact_match", {"type": "regex", "pattern": pattern}])
    assert caught.value.status_code == 400 and caught.value.param == "eval.metrics[1].pattern"
    assert words in caught.value.message


def test_a_metric_past_its_deadline_fails_naming_it() -> None:
    specs = parse_metrics(["exact_match", {"type": "regex", "pattern": "x"}])
    with pytest.raises(MetricFailed) as caught:
        aggregate(specs, ["x", "y", "z"], ["x", "y", "z"], deadline_s=0.0)
    assert caught.value.code == "eval_metric_timeout" and caught.value.param == "eval.metrics"
    assert "task.exact_match" in str(caught.value) and "after 1 of 3 answers" in str(caught.value)


def test_a_metric_that_errors_is_a_metric_failure_not_a_crash(monkeypatch) -> None:
    def broken(_spec, _prediction, _reference):
        raise RecursionError("deep")

    monkeypatch.setattr(metrics, "score", broken)
    with pytest.raises(MetricFailed) as caught:
        aggregate([metrics.Contains()], ["a", "b"], ["a", "b"])
    assert caught.value.code == "eval_metric_failed" and "task.contains" in str(caught.value)
    assert "RecursionError" in str(caught.value)


def test_rouge_l_compares_a_bounded_number_of_words() -> None:
    limit = metrics.ROUGE_MAX_WORDS
    answer = " ".join(f"w{i}" for i in range(limit))
    huge_reference = answer + " extra" * 100_000  # words past the bound do not count
    assert metrics.rouge_l(answer, huge_reference) == 1.0
