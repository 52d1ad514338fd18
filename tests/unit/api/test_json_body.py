"""The bounded check of JSON bodies: values counted from the bytes before any parse, exactly where
it matters; depth, numbers and (for tenants' bodies) strings refused naming the field."""

from __future__ import annotations

import json

import pytest

from tuneforge.api import json_body
from tuneforge.api.limits import MAX_JSON_DEPTH, MAX_JSON_VALUES


def _values(document) -> int:
    """Values as json_body counts them: the root, each array item, each object member."""
    if isinstance(document, dict):
        return 1 + sum(_values(v) for v in document.values())
    if isinstance(document, list):
        return 1 + sum(_values(v) for v in document)
    return 1


@pytest.mark.parametrize("document", [
    {"a": [1, 2, {"b": None}], "c": "x"},
    [],
    [[], {}, [[]]],
    "just a string",
    {"text": "commas, [brackets] and {braces} inside a string do not count"},
])
def test_a_small_body_is_counted_from_above(document):
    raw = json.dumps(document).encode()
    assert _values(document) <= json_body.value_count(raw) <= MAX_JSON_VALUES


def test_a_count_over_the_limit_is_exact_once_strings_are_taken_out():
    # punctuation inside strings (escaped quotes and backslashes too) pushes the first bound over
    # the limit; the second count sees the 3 values there are
    text = ('a, b [c] {d} \\" \\\\' * (MAX_JSON_VALUES // 2))
    raw = json.dumps({"prompt": text, "n": [1]}).encode()
    assert raw.count(b",") + raw.count(b"[") + raw.count(b"{") > MAX_JSON_VALUES
    assert json_body.value_count(raw) == 4
    assert json_body.check(raw) is None


def test_many_values_are_refused_before_any_parse(monkeypatch):
    raw = b"[" + b",".join([b"0"] * (MAX_JSON_VALUES + 1)) + b"]"
    assert json_body.value_count(raw) == MAX_JSON_VALUES + 2

    def no_parse(*_args, **_kwargs):
        raise AssertionError("parsed a body with too many values")

    monkeypatch.setattr(json_body.json, "loads", no_parse)
    error = json_body.check(raw)
    assert error is not None and (error.status_code, error.code) == (413, "json_too_many_values")
    assert str(MAX_JSON_VALUES) in error.message


def test_many_short_strings_are_counted_by_their_quotes():
    raw = b"[" + b",".join([b'"a"'] * (2 * MAX_JSON_VALUES + 2)) + b"]"
    assert json_body.value_count(raw) > MAX_JSON_VALUES
    assert json_body.check(raw).code == "json_too_many_values"


def test_values_at_the_limit_pass():
    raw = b"[" + b",".join([b"1"] * (MAX_JSON_VALUES - 1)) + b"]"
    assert json_body.value_count(raw) == MAX_JSON_VALUES
    assert json_body.check(raw) is None


def test_depth_is_refused_naming_the_deepest_field():
    nested: dict = {}
    inner = nested
    for _ in range(MAX_JSON_DEPTH + 2):
        inner["k"] = {}
        inner = inner["k"]
    error = json_body.check(json.dumps(nested).encode())
    assert (error.status_code, error.code, error.param) == (400, "json_too_deep", ".".join(["k"] * MAX_JSON_DEPTH))
    assert json_body.check(b"[" * 100_000 + b"]" * 100_000).code == "json_too_deep"


@pytest.mark.parametrize(("raw", "param"), [
    (b'{"a": {"b": [1, "x\\u0000"]}}', "a.b.1"),
    (b'{"a": "\\ud800"}', "a"),
    (b'{"a\\u0000": 1}', "a\x00"),
])
def test_tenant_strings_with_nul_or_lone_surrogates_are_400(raw, param):
    error = json_body.check(raw)
    assert (error.status_code, error.code, error.param) == (400, "invalid_value", param)


def test_a_trainer_report_is_not_held_to_the_tenant_string_rules():
    # domain/reports.py decides what a report's text may hold
    assert json_body.check(b'{"events": [{"message": "loss \\u0000 \\ud800"}]}', content_rules=False) is None


@pytest.mark.parametrize("content_rules", [True, False])
@pytest.mark.parametrize(("raw", "param"), [
    (b'{"x": [1e400]}', "x.0"), (b'{"x": NaN}', "x"), (b'{"x": 9223372036854775808}', "x"),
])
def test_numbers_beyond_what_is_stored_are_400_for_everyone(raw, param, content_rules):
    error = json_body.check(raw, content_rules=content_rules)
    assert (error.status_code, error.param) == (400, param)


def test_malformed_json_is_400():
    error = json_body.check(b'{"a": ')
    assert (error.status_code, error.code) == (400, "invalid_json")
