"""iter_jsonl: streaming, blank lines skipped, errors name their line."""

from __future__ import annotations

import io

import pytest

from tuneforge.data.errors import BadDataError
from tuneforge.data.reader import iter_jsonl


def test_yields_objects_with_editor_line_numbers_skipping_blank_lines() -> None:
    stream = io.BytesIO(b'{"a": 1}\n\n   \n{"b": 2}\r\n{"c": "\xc3\xa9"}')
    assert list(iter_jsonl(stream)) == [(1, {"a": 1}), (4, {"b": 2}), (5, {"c": "é"})]


def test_leading_byte_order_mark_is_ignored() -> None:
    assert list(iter_jsonl(io.BytesIO(b'\xef\xbb\xbf{"a": 1}\n'))) == [(1, {"a": 1})]


def test_streams_lazily() -> None:
    lines = iter([b'{"a": 1}\n', b"not json\n"])
    reader = iter_jsonl(lines)
    assert next(reader) == (1, {"a": 1})  # the bad second line is not read yet


@pytest.mark.parametrize(
    ("payload", "code", "fragment"),
    [
        (b'{"a": 1}\n{"a": \n', "invalid_json", "line 2: not valid JSON"),
        (b'{"a": 1}\n\n[1, 2]\n', "invalid_example", "line 3: expected a JSON object, got list"),
        (b'{"a": "\xff"}\n', "invalid_encoding", "line 1: not valid UTF-8"),
    ],
)
def test_bad_line_raises_data_error_naming_it(payload: bytes, code: str, fragment: str) -> None:
    with pytest.raises(BadDataError) as caught:
        list(iter_jsonl(io.BytesIO(payload)))
    assert caught.value.code == code
    assert str(caught.value).startswith(fragment)
