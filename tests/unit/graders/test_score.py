"""Scoring a grader on samples: string checks, similarity, multi graders and their formulas,
templates, error flags, model graders through a judge, and what `check` refuses (400 naming the
field). Python graders: tests/unit/graders/test_sandbox.py and tests/security/test_grader_sandbox.py."""

from __future__ import annotations

from typing import Any

import pytest

from tuneforge.domain.errors import ApiError
from tuneforge.graders import check, templates
from tuneforge.graders.score import GradingTools, JudgeError, JudgeReply, result_json, score_batch
from tuneforge.graders.templates import Sample

TOOLS = GradingTools()


def run(raw: dict[str, Any], output: str, item: dict[str, Any] | None = None, tools: GradingTools = TOOLS) -> Any:
    grader = check.parse(raw, "grader")
    return score_batch(grader, [Sample.from_text(output)], [item or {}], tools)[0]


def string_check(operation: str, text: str = "{{sample.output_text}}", reference: str = "{{item.answer}}") -> dict:
    return {"type": "string_check", "name": "check", "operation": operation, "input": text, "reference": reference}


@pytest.mark.parametrize(("operation", "output", "answer", "reward"), [
    ("eq", "Paris", "Paris", 1.0), ("eq", "paris", "Paris", 0.0), ("eq", "Paris ", "Paris", 0.0),
    ("ne", "Paris", "Paris", 0.0), ("ne", "Lyon", "Paris", 1.0),
    ("like", "It is Paris.", "Paris", 1.0), ("like", "It is paris.", "Paris", 0.0),
    ("ilike", "It is PARIS.", "paris", 1.0), ("ilike", "It is Lyon.", "paris", 0.0),
])
def test_string_check_operations(operation: str, output: str, answer: str, reward: float) -> None:
    result = run(string_check(operation), output, {"answer": answer})
    assert result.reward == reward and not result.errors.any()


def test_text_similarity_scores_through_the_metric() -> None:
    raw = {"type": "text_similarity", "name": "sim", "evaluation_metric": "rouge_1",
           "input": "{{sample.output_text}}", "reference": "{{item.reference}}"}
    # unigrams: "the cat sat" vs "the cat ran": 2 shared of 3 each -> P = R = F1 = 2/3
    assert run(raw, "the cat sat", {"reference": "the cat ran"}).reward == pytest.approx(2 / 3)
    fuzzy = {**raw, "evaluation_metric": "fuzzy_match"}
    # Indel similarity: "kitten" / "sitting": 1 - (2 + 3... ) -> rapidfuzz's ratio 61.538... / 100
    assert run(fuzzy, "kitten", {"reference": "sitting"}).reward == pytest.approx(8 / 13)


def test_a_multi_grader_combines_its_sub_graders_by_the_formula() -> None:
    # OpenAI's documented example shape: graders keyed by name, combined by calculate_output
    raw = {"type": "multi", "name": "both", "calculate_output": "(name + email) / 2",
           "graders": {"name": string_check("eq", reference="{{item.name}}") | {"name": "name"},
                       "email": string_check("like", reference="@") | {"name": "email"}}}
    result = run(raw, "Ada", {"name": "Ada"})
    assert result.sub_rewards == {"name": 1.0, "email": 0.0} and result.reward == 0.5
    body = result_json(check.parse(raw, "grader"), result)
    assert body["sub_rewards"] == {"name": 1.0, "email": 0.0}
    assert body["metadata"]["type"] == "multi" and body["metadata"]["errors"]["formula_parse_error"] is False


def test_a_single_grader_object_under_graders_is_keyed_by_its_name() -> None:
    raw = {"type": "multi", "name": "one", "calculate_output": "2 * exact",
           "graders": string_check("eq") | {"name": "exact"}}
    assert run(raw, "yes", {"answer": "yes"}).reward == 2.0


def test_a_formula_that_fails_on_a_sample_scores_zero_with_its_flag() -> None:
    raw = {"type": "multi", "name": "ratio", "calculate_output": "a / b",
           "graders": {"a": string_check("eq") | {"name": "a"}, "b": string_check("ne") | {"name": "b"}}}
    result = run(raw, "yes", {"answer": "yes"})  # b is 0: division by zero
    assert result.reward == 0.0 and result.errors.formula_parse_error


def test_templates_read_the_item_and_the_samples_json() -> None:
    raw = string_check("eq", text="{{sample.output_json.city}}", reference="{{item.expected.city}}")
    assert run(raw, '{"city": "Oslo"}', {"expected": {"city": "Oslo"}}).reward == 1.0
    listed = string_check("eq", text="{{sample.output_json.cities.1}}", reference="Rome")
    assert run(listed, '{"cities": ["Oslo", "Rome"]}').reward == 1.0
    # not JSON: output_json is absent -> the sample's parse error, reward 0
    failed = run(raw, "Oslo", {"expected": {"city": "Oslo"}})
    assert failed.reward == 0.0 and failed.errors.sample_parse_error and not failed.errors.invalid_variable_error
    # a field the item lacks
    missing = run(string_check("eq", reference="{{item.nope}}"), "x", {"answer": "x"})
    assert missing.reward == 0.0 and missing.errors.invalid_variable_error
    # non-string values render as compact JSON
    assert templates.render("{{item.n}} {{item.xs}}", Sample("x"), {"n": 3, "xs": [1, "a"]}) == '3 [1,"a"]'


def test_sample_output_tools_and_item_fields() -> None:
    grader = check.parse(string_check("eq", text="{{item.a}}{{item.b.c}}", reference="{{sample.output_text}}"),
                         "grader")
    assert check.item_fields(grader) == {"a", "b"}
    assert check.missing_fields(grader, {"a": 1}) == ["b"]


class Judge:
    def __init__(self, text: str, *, fail: bool = False, refused: bool = False) -> None:
        self.text, self.fail, self.refused, self.asked = text, fail, refused, []

    def check(self, grader: Any, where: str) -> None:
        pass

    def complete_many(self, grader: Any, conversations: list[list[dict[str, str]]], *, sampling: Any,
                      schema: Any) -> list[JudgeReply | JudgeError]:
        replies: list[JudgeReply | JudgeError] = []
        for messages in conversations:
            self.asked.append((grader.model, messages, dict(sampling), schema))
            replies.append(JudgeError("the judge endpoint answered 503") if self.fail
                           else JudgeReply(self.text, tokens=42, refused=self.refused))
        return replies


def score_model(**changes: Any) -> dict[str, Any]:
    return {"type": "score_model", "name": "judge", "model": "judge-1", "range": [0, 10],
            "input": [{"role": "system", "content": "Rate 0-10."},
                      {"role": "user", "content": "Q: {{item.q}} A: {{sample.output_text}}"}],
            "sampling_params": {"temperature": 0.0}, **changes}


def test_a_score_model_grader_asks_the_judge_with_the_rendered_prompt() -> None:
    judge = Judge('{"result": 7.5, "steps": []}')
    result = run(score_model(), "4", {"q": "2+2"}, GradingTools(judge=judge))
    assert result.reward == 7.5 and result.judge_tokens == {"judge-1": 42}
    model, messages, sampling, schema = judge.asked[0]
    assert model == "judge-1" and messages[1] == {"role": "user", "content": "Q: 2+2 A: 4"}
    assert sampling == {"temperature": 0.0} and schema["properties"]["result"]["type"] == "number"
    out_of_range = run(score_model(), "4", {"q": "2+2"}, GradingTools(judge=Judge('{"result": 11}')))
    assert out_of_range.reward == 0.0 and out_of_range.errors.model_grader_parse_error
    down = run(score_model(), "4", {"q": "2+2"}, GradingTools(judge=Judge("", fail=True)))
    assert down.errors.model_grader_server_error and "503" in down.errors.model_grader_server_error_details
    refused = run(score_model(), "4", {"q": "2+2"}, GradingTools(judge=Judge("", refused=True)))
    assert refused.errors.model_grader_refusal_error


def test_a_label_model_grader_passes_on_a_passing_label() -> None:
    raw = {"type": "label_model", "name": "tone", "model": "judge-1", "labels": ["polite", "rude", "neutral"],
           "passing_labels": ["polite", "neutral"], "input": [{"role": "user", "content": "{{sample.output_text}}"}]}
    assert run(raw, "hi", tools=GradingTools(judge=Judge('{"result": "neutral"}'))).reward == 1.0
    assert run(raw, "hi", tools=GradingTools(judge=Judge("rude"))).reward == 0.0
    unknown = run(raw, "hi", tools=GradingTools(judge=Judge("sarcastic")))
    assert unknown.reward == 0.0 and unknown.errors.model_grader_parse_error


@pytest.mark.parametrize(("raw", "param", "words"), [
    ({"type": "regex", "name": "x"}, "grader.type", "not a grader type"),
    ({**string_check("eq"), "operation": "startswith"}, "grader.operation", "operation"),
    ({**string_check("eq"), "input": "{{answer}}"}, "grader.input", "templates read item.* or sample.*"),
    ({**string_check("eq"), "input": "{{sample.text}}"}, "grader.input", "names no sample field"),
    ({"type": "multi", "name": "m", "calculate_output": "a + c", "graders": {"a": string_check("eq")}},
     "grader.calculate_output", "'c'"),
    ({"type": "multi", "name": "m", "calculate_output": "a", "graders": {"a": {**string_check("eq"),
                                                                             "reference": "{{itm.x}}"}}},
     "grader.graders.a.reference", "templates read"),
    ({"type": "text_similarity", "name": "s", "evaluation_metric": "cosine", "input": "a", "reference": "b"},
     "grader.evaluation_metric", "embeddings endpoint"),
    (score_model(), "grader.model", "asks no judges"),
    ({"type": "python", "name": "p", "source": "def grade(s, i): return 1"}, "grader.source", "sandbox"),
    ({**score_model(), "range": [1, 0]}, "grader.range", "low < high"),
    ({"type": "label_model", "name": "l", "model": "m", "labels": ["a"], "passing_labels": ["b"],
      "input": [{"role": "user", "content": "x"}]}, "grader", "passing_labels"),
])
def test_bad_graders_are_refused_naming_the_field(raw: dict[str, Any], param: str, words: str) -> None:
    with pytest.raises(ApiError) as caught:
        check.check(check.parse(raw, "grader"), TOOLS, "grader")
    assert caught.value.status_code == 400 and caught.value.param == param, caught.value
    assert words in caught.value.message


def test_a_python_source_over_256_kb_is_refused() -> None:
    source = "def grade(sample, item):\n    return 1\n" + "#" * (256 * 1024)
    with pytest.raises(ApiError) as caught:
        check.parse({"type": "python", "name": "p", "source": source}, "grader")
    assert caught.value.param == "grader.source"
