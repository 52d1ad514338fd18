"""JSON mode's checker: every prefix of a JSON object is viable, a whole one complete, anything else not."""

from __future__ import annotations

import json

import pytest

from tuneforge.serve.constrained import COMPLETE, INVALID, PARTIAL, json_prefix

WHOLE = [
    '{}',
    '{"a": 1}',
    ' {"a": [1, 2.5, -3e+2, 0, true, false, null], "b": {"c": "x\\"y\\\\z\\u00e9"}} ',
    '{"n": -0.25E-3, "empty": [], "o": {}, "s": ""}',
    '{"nested": [[{"x": [0]}]]}',
    '{"e": 1e5, "f": -0.0E+1, "g": 10}',
]


@pytest.mark.parametrize("text", WHOLE)
def test_every_prefix_of_an_object_is_viable_and_the_whole_is_complete(text):
    json.loads(text)  # the cases are JSON
    for end in range(len(text.rstrip())):
        assert json_prefix(text[:end]) == PARTIAL, text[:end]
    assert json_prefix(text) == COMPLETE


@pytest.mark.parametrize("text", [
    '[1, 2]',  # not an object
    '"a"',
    '{"a" 1}',  # no colon
    '{a: 1}',  # unquoted key
    '{"a": 01}',  # leading zero
    '{"a": 1.}x',
    '{"a": tru3}',
    '{"a": 1,}',  # trailing comma
    '{"a": "\\x"}',  # bad escape
    '{"a": "line\nbreak"}',  # a raw control character in a string
    '{"a": 1}}',
    '{"a": 1} {',
    '{"a": [1 2]}',
    '{"a": -}',
    '{"a": 1e}',
    '{"a": 00}',
    '{"a": 1.e3}',
])
def test_what_no_json_object_starts_with_is_invalid(text):
    assert json_prefix(text) == INVALID


def test_any_value_when_not_restricted_to_objects():
    assert json_prefix("[1, 2]", object_only=False) == COMPLETE
    assert json_prefix("12", object_only=False) == COMPLETE
    assert json_prefix("12.", object_only=False) == PARTIAL
    assert json_prefix('"ab', object_only=False) == PARTIAL


@pytest.mark.parametrize("prefix", ['{', '{"a', '{"a"', '{"a":', '{"a": [1, {"b": tr', '{"a": "x\\', '{"a": -',
                                    '{"a": "\\u00', '{"a": [', '{"a": 1,', '{"a": {"b": 2.5'])
def test_closing_makes_any_viable_prefix_a_whole_object(prefix):
    from tuneforge.serve.constrained import closing

    whole = prefix + closing(prefix)
    assert json_prefix(whole) == COMPLETE and isinstance(json.loads(whole), dict), whole
