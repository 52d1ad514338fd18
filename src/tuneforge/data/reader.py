"""Stream a JSONL file line by line without loading it whole."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import IO, Any

from tuneforge.data.errors import BadDataError

_UTF8_BOM = b"\xef\xbb\xbf"


def iter_jsonl(stream: IO[bytes] | Iterable[bytes]) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield `(line_number, object)` for every non-blank line of a JSONL byte stream.

    Line numbers are 1-based and count blank lines too, so they match what an
    editor shows. A leading UTF-8 byte-order mark is ignored. A line that is
    not UTF-8, not JSON, or not a JSON object raises `BadDataError` naming it.
    """
    for line_number, raw in enumerate(stream, start=1):
        if line_number == 1 and raw.startswith(_UTF8_BOM):
            raw = raw[len(_UTF8_BOM):]
        if not raw.strip():
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadDataError(
                "invalid_encoding", f"not valid UTF-8 ({exc.reason})", line_number=line_number
            ) from None
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise BadDataError(
                "invalid_json", f"not valid JSON ({exc.msg})", line_number=line_number
            ) from None
        if not isinstance(value, dict):
            raise BadDataError(
                "invalid_example",
                f"expected a JSON object, got {type(value).__name__}",
                line_number=line_number,
            )
        yield line_number, value
