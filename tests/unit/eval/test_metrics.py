"""Task metrics: each metric's score on known answers, ROUGE-L against hand-computed LCS,
the aggregate keys, and the exact field every bad `eval.metrics` item is blamed on."""

from __future__ import annotations

import pytest

from tuneforge.domain.errors import ApiError
from tuneforge.eval import metrics
from tuneforge.eval.metrics import (
    Contains,
    ExactMatch,
    JsonValid,
    LlmJudge,
    Regex,
    RougeL,
)
from tuneforge.eval.openai_chat import ChatEndpoint


def test_exact_match_trims_whitespace_and_ignores_case_by_default():
    assert metrics.score(ExactMatch(), "  Paris \n", "paris") == 1.0
    assert metrics.score(ExactMatch(case_sensitive=True), "  Paris \n", "paris") == 0.0
    assert metrics.score(ExactMatch(case_sensitive=True), "Paris", " Paris") == 1.0
    assert metrics.score(ExactMatch(), "Paris.", "Paris") == 0.0


def test_contains_finds_the_reference_inside_the_answer():
    assert metrics.score(Contains(), "The answer is 12.", "12") == 1.0
    assert metrics.score(Contains(), "The answer is 1.", "12") == 0.0
    assert metrics.score(Contains(), "It is PARIS", " paris ") == 1.0
    assert metrics.score(Contains(case_sensitive=True), "It is PARIS", "paris") == 0.0


def test_regex_searches_the_answer_and_ignores_the_reference():
    digits = Regex(pattern=r"^\d+$")
    assert metrics.score(digits, "42", "anything") == 1.0
    assert metrics.score(digits, "42 apples", "42") == 0.0
    assert metrics.score(Regex(pattern="apple"), "two apples", "") == 1.0


def test_json_valid_parses_the_trimmed_answer():
    assert metrics.score(JsonValid(), ' {"a": 1}\n', "") == 1.0
    assert metrics.score(JsonValid(), "[1, 2]", "") == 1.0
    assert metrics.score(JsonValid(require_object=True), "[1, 2]", "") == 0.0
    assert metrics.score(JsonValid(require_object=True), '{"a": [1]}', "") == 1.0
    assert metrics.score(JsonValid(), "{'a': 1}", "") == 0.0
    assert metrics.score(JsonValid(), "", "") == 0.0


def test_lcs_length_on_known_sequences():
    assert metrics.lcs_length("ABCBDAB", "BDCABA") == 4  # e.g. BCBA
    assert metrics.lcs_length("AGGTAB", "GXTXAYB") == 4  # GTAB
    assert metrics.lcs_length("abc", "") == 0
    assert metrics.lcs_length("abc", "abc") == 3


def test_rouge_l_f1_on_hand_computed_examples():
    # LCS "the cat on the mat" = 5 of 6 words on both sides: P = R = F1 = 5/6
    assert metrics.rouge_l("The cat sat on the mat.", "the cat is on the mat") == pytest.approx(5 / 6)
    # LCS "a c" = 2: P = 2/4, R = 2/2, F1 = 2 * 0.5 * 1 / 1.5 = 2/3
    assert metrics.rouge_l("a b c d", "a c") == pytest.approx(2 / 3)
    assert metrics.rouge_l("Paris", "paris") == 1.0
    assert metrics.rouge_l("London", "Paris") == 0.0
    assert metrics.rouge_l("", "") == 1.0
    assert metrics.rouge_l("", "Paris") == 0.0
    assert metrics.score(RougeL(), "a b c d", "a c") == pytest.approx(2 / 3)


def test_aggregate_averages_each_metric_over_the_examples():
    specs = metrics.parse_metrics(None)
    predictions = ["12", "Paris", "blue whale", "Rome"]
    references = ["12", "paris", "blue whale", "Oslo"]
    assert metrics.aggregate(specs, predictions, references) == {"task.exact_match": 0.75, "task.rouge_l": 0.75}
    assert metrics.aggregate(specs, ["the cat sat on the mat", "x"], ["the cat is on the mat", "x"]) == {
        "task.exact_match": 0.5, "task.rouge_l": pytest.approx((5 / 6 + 1) / 2)}
    assert metrics.aggregate(specs, [], []) == {}
    with pytest.raises(ValueError, match="2 predictions for 1 references"):
        metrics.aggregate(specs, ["a", "b"], ["a"])


def test_two_regex_metrics_get_distinct_keys_and_the_judge_is_left_to_judge_pairwise():
    specs = metrics.parse_metrics([
        {"type": "regex", "pattern": r"^\d+$"}, {"type": "regex", "pattern": "[a-z]"}, "exact_match",
        {"type": "regex", "pattern": r"^\d+$"}, {"type": "llm_judge", "endpoint": "http://j/v1", "model": "m"},
    ])
    assert metrics.metric_keys(specs) == ["task.regex", "task.regex_2", "task.exact_match", "task.regex",
                                          "task.llm_judge_win_rate"]
    assert metrics.aggregate(specs, ["42", "abc"], ["42", "x"]) == {
        "task.regex": 0.5, "task.regex_2": 0.5, "task.exact_match": 0.5}
    with pytest.raises(TypeError, match="judge_pairwise"):
        metrics.score(specs[-1], "a", "b")


def test_parse_metrics_reads_names_and_options():
    assert metrics.parse_metrics(None) == [ExactMatch(), RougeL()]
    assert metrics.parse_metrics([]) == []
    specs = metrics.parse_metrics([
        "contains", {"type": "exact_match", "case_sensitive": True}, {"type": "json_valid", "require_object": True},
        {"type": "llm_judge", "endpoint": "http://127.0.0.1:9999/v1", "model": "judge", "api_key_secret": "JUDGE_KEY",
         "criteria": "Be terse.", "timeout_s": 5},
    ])
    assert specs == [Contains(), ExactMatch(case_sensitive=True), JsonValid(require_object=True),
                     LlmJudge(ChatEndpoint("http://127.0.0.1:9999/v1", "judge", "JUDGE_KEY", 5.0), "Be terse.")]
    assert specs[3].target.timeout_s == 5.0 and isinstance(specs[3].target.timeout_s, float)
    assert specs[3].target.url == "http://127.0.0.1:9999/v1/chat/completions"
    assert [s.name for s in specs] == ["contains", "exact_match", "json_valid", "llm_judge"]


@pytest.mark.parametrize(("raw", "param", "words"), [
    ("exact_match", "eval.metrics", "must be a list"),
    (["bleu"], "eval.metrics[0]", "unknown metric 'bleu'"),
    (["rouge_l", {"type": "bleu"}], "eval.metrics[1].type", "unknown metric 'bleu'"),
    ([{"pattern": "x"}], "eval.metrics[0].type", "unknown metric None"),
    ([5], "eval.metrics[0]", "must be a metric name or an object"),
    (["exact_match", "regex"], "eval.metrics[1].pattern", "regex needs 'pattern'"),
    ([{"type": "regex", "pattern": "(unclosed"}], "eval.metrics[0].pattern", "not a regular expression RE2 can run"),
    ([{"type": "regex", "pattern": ""}], "eval.metrics[0].pattern", "must be a non-empty string"),
    ([{"type": "exact_match", "case_sensitive": "yes"}], "eval.metrics[0].case_sensitive", "true or false"),
    ([{"type": "contains", "casesensitive": True}], "eval.metrics[0].casesensitive", "has no option"),
    ([{"type": "json_valid", "require_object": 1}], "eval.metrics[0].require_object", "true or false"),
    ([{"type": "llm_judge", "endpoint": "http://j/v1"}], "eval.metrics[0].model", "llm_judge needs \"model\""),
    ([{"type": "llm_judge", "model": "m"}], "eval.metrics[0].endpoint", "exactly one of"),
    ([{"type": "llm_judge", "endpoint": "judge:80", "model": "m"}], "eval.metrics[0].endpoint", "http(s) base URL"),
    ([{"type": "llm_judge", "endpoint": "http://j/v1", "model": "m", "api_key_env": "TUNEFORGE_ADMIN_API_KEY"}],
     "eval.metrics[0].api_key_env", "api_key_secret"),
    ([{"type": "llm_judge", "endpoint": "http://j/v1", "model": "m", "timeout_s": -1}],
     "eval.metrics[0].timeout_s", "positive number"),
    ([{"type": "llm_judge", "endpoint": "http://j/v1", "model": "m", "timeout_s": True}],
     "eval.metrics[0].timeout_s", "positive number"),
])
def test_a_bad_metric_is_a_400_naming_the_field(raw, param, words):
    with pytest.raises(ApiError) as caught:
        metrics.parse_metrics(raw)
    assert caught.value.status_code == 400
    assert caught.value.param == param
    assert words in caught.value.message


@pytest.mark.parametrize(("reply", "verdict"), [
    ("A", "A"), (" b. ", "B"), ("tie", "TIE"), ("**B**", "B"), ("[[A]]", "A"), ("Answer B is better.", "B"),
    ("Verdict: TIE", "TIE"), ("I think it is a tie", "TIE"), ("It's a close call, but A.", "A"),
    ("neither", None), ("TIED", None), ("", None),
])
def test_parse_verdict_takes_the_first_standalone_token(reply, verdict):
    assert metrics.parse_verdict(reply) == verdict
