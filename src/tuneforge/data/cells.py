"""JSON parsing for every reader, and the tabular cells that carry JSON.

A CSV cell is always text, and Parquet exports often store structured fields
as JSON strings too; `decode_cells` turns those back into lists and objects so
that every format hands `shapes` the same record. Arrow tables mark absent
struct fields as null; `drop_nulls` removes them so "absent" means one thing.
"""

from __future__ import annotations

import json
from typing import Any

from tuneforge.data.example import DataIssue, excerpt_of

try:
    import orjson

    loads = orjson.loads  # ~5x faster than json, and validates UTF-8 itself

    def dumps(value: Any) -> bytes:
        return orjson.dumps(value)
except ImportError:  # pragma: no cover - orjson is an optional speed-up

    def loads(data: bytes | str) -> Any:
        """json.loads held to orjson's rules: UTF-8 only, no NaN or Infinity."""
        text = data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data
        return json.loads(text, parse_constant=_reject_constant)

    def dumps(value: Any) -> bytes:
        return json.dumps(value, ensure_ascii=False).encode()


def _reject_constant(name: str) -> Any:
    raise json.JSONDecodeError(f"{name} is not valid JSON", name, 0)

# orjson.JSONDecodeError subclasses this, so one except clause serves both.
JSONDecodeError = json.JSONDecodeError

# Columns that always hold JSON when they arrive as text. An empty cell means absent.
JSON_COLUMNS = frozenset({"messages", "tools", "parallel_tool_calls", "input", "preferred_output",
                          "non_preferred_output"})
# Columns that hold either plain text (an answer) or JSON (a message or a list of
# messages). Decoded only when the JSON is recognisably a message, so an answer
# that happens to be a JSON document stays text.
MESSAGE_OR_TEXT_COLUMNS = frozenset({"chosen", "rejected"})


def decode_cells(record: dict[str, Any], line: int, json_columns: frozenset[str]) -> dict[str, Any] | DataIssue:
    """`record` with its JSON-holding text cells decoded, or the issue of the first bad one."""
    for column in json_columns:
        value = record.get(column)
        if not isinstance(value, str):
            continue
        if not value.strip():
            del record[column]
            continue
        try:
            record[column] = loads(value)
        except JSONDecodeError as exc:
            return DataIssue(
                "invalid_json",
                f"column '{column}' must hold JSON: {exc.msg} at column {exc.colno}",
                line=line, field=column, excerpt=excerpt_of(value),
            )
    for column in MESSAGE_OR_TEXT_COLUMNS:
        value = record.get(column)
        if isinstance(value, str) and value.lstrip()[:1] in ("{", "["):
            decoded = _try_loads(value)
            if _is_message(decoded) or (
                isinstance(decoded, list) and decoded and all(_is_message(item) for item in decoded)
            ):
                record[column] = decoded
    return record


def _try_loads(text: str) -> Any:
    try:
        return loads(text)
    except JSONDecodeError:
        return None


def _is_message(value: Any) -> bool:
    return isinstance(value, dict) and "role" in value


def drop_nulls(value: Any) -> Any:
    """`value` with every null-valued object key removed, at any depth."""
    if isinstance(value, dict):
        return {key: drop_nulls(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [drop_nulls(item) for item in value]
    return value
