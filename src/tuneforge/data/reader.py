"""Stream a JSONL file line by line without loading it whole (the trainer's reader).

Parsing is `formats.parse_jsonl_line`, the same as upload validation, so a
line the trainer rejects is one validation reported with the same words.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import IO, Any

from tuneforge.data.errors import BadDataError
from tuneforge.data.example import DataIssue
from tuneforge.data.formats import parse_jsonl_line

_UTF8_BOM = b"\xef\xbb\xbf"
# The trainer's error code for a line that is JSON but not an object predates `invalid_type`.
_TRAINER_CODES = {"invalid_type": "invalid_example"}


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
        value = parse_jsonl_line(raw, line_number)
        if isinstance(value, DataIssue):
            code = _TRAINER_CODES.get(value.code, value.code)
            raise BadDataError(code, value.message, line_number=line_number)
        yield line_number, value
