"""JSON bodies checked with bounded work, before a route sees them.

What a JSON parse costs grows with the values a body holds, not with its bytes: 16 MiB of
`[0,0,...]` is 8 million values, seconds of CPU on the event loop and about a GiB of objects
(twice: the route's framework parses the body again). So a body's values are counted first, from
its bytes, at the speed of `bytes.count`; one holding more than `MAX_JSON_VALUES` is refused
before anything is parsed (413). Every body that passes costs at most that many values to parse,
here and again in the route.

Then the body is parsed and walked: nesting deeper than `MAX_JSON_DEPTH`, a number that is not
finite (`1e400`, `NaN`) or an integer outside int64 answer 400 naming the field; with the content
rules of tenant bodies, so does a string holding NUL or a lone surrogate. A trainer's reports
(/internal) go without those string rules: their typed models (domain/reports.py) decide what a
report's text may hold.

`check` is the whole of it; api/guard.py runs it on the event loop for a small body and in a
thread for a large one (`MAX_INLINE_JSON_BYTES`), so that the loop goes on answering meanwhile.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from tuneforge.api.limits import INT64_MAX, INT64_MIN, MAX_JSON_DEPTH, MAX_JSON_VALUES
from tuneforge.domain.errors import ApiError, invalid

# A JSON string once its escaped backslashes and quotes are gone: no quote inside it.
_PLAIN_STRING = re.compile(rb'"[^"]*"')


def check(body: bytes, *, content_rules: bool = True) -> ApiError | None:
    """The error a JSON body gets (413 for too many values, 400 otherwise), or None when the API
    takes it. `content_rules`: also refuse NUL and lone surrogates in strings (tenant bodies)."""
    if value_count(body) > MAX_JSON_VALUES:
        return too_many_values()
    try:
        document = json.loads(body)
    except RecursionError:
        return _too_deep(None)
    except ValueError as exc:  # malformed JSON, bad UTF-8, an integer of thousands of digits
        reason = getattr(exc, "msg", None) or str(exc).split(":")[0]
        return ApiError(400, f"We could not parse the JSON body of your request. ({reason})", code="invalid_json")
    return _walk(document, content_rules)


def value_count(body: bytes) -> int:
    """How many values (array items, object members, the root) the JSON text `body` holds: exact
    for valid JSON when it is over `MAX_JSON_VALUES`, an upper bound when it is not.

    Each value but the root follows a '[', '{' or ',' outside a string. Counting those in the
    whole text also counts the ones inside strings, so only a count over the limit is looked at
    again, with the strings taken out: first the escapes that could hide a quote (`\\\\`, then
    `\\"`), which leaves every string as a quote, no quote, a quote."""
    bound = 1 + body.count(b",") + body.count(b"[") + body.count(b"{")
    if bound <= MAX_JSON_VALUES:
        return bound
    plain = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    strings = plain.count(b'"') // 2
    if strings > 2 * MAX_JSON_VALUES:  # a value holds at most two strings: its key and itself
        return strings // 2
    outside = _PLAIN_STRING.sub(b"", plain)
    return 1 + outside.count(b",") + outside.count(b"[") + outside.count(b"{")


def too_many_values() -> ApiError:
    return ApiError(413, f"The JSON body holds more than {MAX_JSON_VALUES} values (array items and object "
                         "members).", param=None, code="json_too_many_values")


def _walk(document: Any, content_rules: bool) -> ApiError | None:
    """The first problem of a parsed body. A field's path is built only for containers (and for a
    scalar once it is found wrong), so that the walk allocates little per value."""
    if not isinstance(document, (dict, list)):
        return _scalar_problem(document, (), content_rules)
    stack: list[tuple[Any, tuple[str, ...]]] = [(document, ())]
    while stack:
        value, path = stack.pop()
        if len(path) >= MAX_JSON_DEPTH:
            return _too_deep(".".join(path))
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            if content_rules and isinstance(key, str) and (problem := _string_problem(key, (*path, key), "key")):
                return problem
            if isinstance(item, (dict, list)):
                stack.append((item, (*path, str(key))))
            elif not isinstance(item, (bool, type(None))) and (
                    problem := _scalar_problem(item, (*path, str(key)), content_rules)):
                return problem
    return None


def _scalar_problem(value: Any, path: tuple[str, ...], content_rules: bool) -> ApiError | None:
    if isinstance(value, str):
        return _string_problem(value, path, "value") if content_rules else None
    if isinstance(value, float) and not math.isfinite(value):
        return _field_error(path, "must be a finite number (1e400, Infinity and NaN are not)")
    if isinstance(value, int) and not isinstance(value, bool) and not INT64_MIN <= value <= INT64_MAX:
        return _field_error(path, f"integers must lie within [{INT64_MIN}, {INT64_MAX}]")
    return None


def _string_problem(text: str, path: tuple[str, ...], what: str) -> ApiError | None:
    if "\x00" in text:
        return _field_error(path, f"a string {what} must not contain NUL (\\u0000)")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _field_error(path, f"a string {what} must be valid Unicode: a lone surrogate "
                                  "(\\ud800-\\udfff without its pair) is not")
    return None


def _field_error(path: tuple[str, ...], reason: str) -> ApiError:
    param = ".".join(path) or None
    return invalid(f"Invalid value for {param or 'body'}: {reason}", param=param, code="invalid_value")


def _too_deep(param: str | None) -> ApiError:
    return invalid(f"The JSON body is nested more than {MAX_JSON_DEPTH} levels deep.", param=param,
                   code="json_too_deep")
