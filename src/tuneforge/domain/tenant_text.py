"""What a tenant may read of text the platform did not write itself.

A trainer's report is not fully trusted: its messages can carry a Python
traceback, absolute paths of the host or the repr of an internal object.
`scrub` removes those before a message becomes a job's error or event; the
details stay in the operator's logs, under the correlation id the tenant sees.

Text a model produces (a byte-level tokenizer can emit any byte) or a tenant
wrote is data, and `safe_text` makes it safe to store and show: PostgreSQL
refuses NUL in `text` and `jsonb`, a lone surrogate cannot be encoded as UTF-8
(a JSON answer holding one fails to serialise), and control characters garble
a terminal or a log line. Each C0 control but tab, newline and carriage
return, DEL and each C1 control becomes the visible six-character escape
`\\u0000` (so a reader still sees which byte the model emitted); each lone
surrogate becomes U+FFFD, the replacement character (it stands for no byte).
`bounded` cuts long text with a marker saying how much was cut.
"""

from __future__ import annotations

import re
from typing import Any

MAX_MESSAGE_CHARS = 2000
REPLACEMENT_CHARACTER = "\ufffd"
# C0 controls but \t \n \r, DEL, C1 controls, and any surrogate code point: in a Python str a
# surrogate is always lone (a valid pair decodes to one astral character)
_UNSAFE_CHARACTER = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")
_SURROGATE = re.compile("[\ud800-\udfff]")
TRUNCATION_MARKER = "…[{cut_chars} more characters cut]"
_TRACEBACK_HEADER = re.compile(r"^\s*Traceback \(most recent call last\):?\s*$")
_CHAINED = re.compile(r"^\s*(During handling of the above exception|The above exception was the direct cause)")
# `File "/x/y.py", line 3, in f` — alone on its line in a traceback, or inline in a flattened one
_FRAME = re.compile(r"\s*File \"[^\"\n]*\", line \d+(?:, in [\w<>.]+)?")
_INLINE_HEADER = re.compile(r"Traceback \(most recent call last\):?")
_FRAME_LINE = re.compile(r"^\s*File \"[^\"\n]*\", line \d+")
_OBJECT_REPR = re.compile(r"<[\w.]+(?: [\w.]+)* (?:object|at) (?:at )?0x[0-9a-fA-F]+>")
_POSIX_PATH = re.compile(r"(?<![\w.:/~-])/(?:[\w.@+~-]+/)+[\w.@+~-]*")
_WINDOWS_PATH = re.compile(r"\b[A-Za-z]:\\(?:[\w.@+~ -]+\\)*[\w.@+~-]*")
_MANY_BLANKS = re.compile(r"\n{3,}")
PATH_PLACEHOLDER = "<path>"


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group(0))
    return REPLACEMENT_CHARACTER if 0xD800 <= code <= 0xDFFF else f"\\u{code:04x}"


def safe_text(text: str) -> str:
    """`text` safe to store as JSON or TEXT on SQLite and PostgreSQL and to show: controls but
    tab, newline and carriage return escaped as `\\u0000`, lone surrogates replaced by U+FFFD.
    Character by character, so a prefix of the text maps to a prefix of the result (a stream
    can hand out what it sanitised so far)."""
    if _UNSAFE_CHARACTER.search(text) is None:  # the common case: one scan, no copy
        return text
    return _UNSAFE_CHARACTER.sub(_escaped, text)


def valid_unicode(text: str) -> str:
    """`text` with each lone surrogate replaced by U+FFFD and nothing else changed: what a
    tokenizer (Rust strings are UTF-8) or an encoder can take, for text a model must read as is."""
    if _SURROGATE.search(text) is None:
        return text
    return _SURROGATE.sub(REPLACEMENT_CHARACTER, text)


def bounded(text: str, max_chars: int) -> str:
    """`text` cut to at most `max_chars` characters, the cut said by a marker at its end."""
    if len(text) <= max_chars:
        return text
    # sized for the longest count it could say, so the result never passes `max_chars`
    keep_chars = max(0, max_chars - len(TRUNCATION_MARKER.format(cut_chars=len(text))))
    return text[:keep_chars] + TRUNCATION_MARKER.format(cut_chars=len(text) - keep_chars)


def safe_data(value: Any, *, max_string_chars: int | None = None) -> Any:
    """A JSON value with every string (keys included) through `safe_text`, and cut by `bounded`
    when `max_string_chars` is given; numbers, booleans and None as they are."""
    if isinstance(value, str):
        text = safe_text(value)
        return text if max_string_chars is None else bounded(text, max_string_chars)
    if isinstance(value, dict):
        return {safe_data(str(key), max_string_chars=max_string_chars):
                safe_data(item, max_string_chars=max_string_chars) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [safe_data(item, max_string_chars=max_string_chars) for item in value]
    return value


def scrub(text: str, max_chars: int = MAX_MESSAGE_CHARS) -> str:
    """`text` without traceback frames, absolute paths and object reprs, at most `max_chars` long,
    and safe to store and show (`safe_text`)."""
    if not text:
        return ""
    text = safe_text(text)
    kept = _without_frames(text.splitlines())
    cleaned = _INLINE_HEADER.sub("", _FRAME.sub("", "\n".join(kept)))
    cleaned = _OBJECT_REPR.sub("<object>", cleaned)
    cleaned = _POSIX_PATH.sub(PATH_PLACEHOLDER, cleaned)
    cleaned = _WINDOWS_PATH.sub(PATH_PLACEHOLDER, cleaned)
    cleaned = _MANY_BLANKS.sub("\n\n", cleaned).strip()
    return cleaned if len(cleaned) <= max_chars else cleaned[: max_chars - 3].rstrip() + "..."


def _without_frames(lines: list[str]) -> list[str]:
    """Drop the header, every frame and the source line printed under it; the final
    `SomeError: message` line of a traceback is kept (its paths are scrubbed next)."""
    kept: list[str] = []
    in_frame = False
    for line in lines:
        if _TRACEBACK_HEADER.match(line) or _CHAINED.match(line):
            in_frame = False
            continue
        if _FRAME_LINE.match(line):
            in_frame = True
            continue
        if in_frame and line.startswith((" ", "\t")):  # the frame's source line, its ^^^^ markers
            continue
        in_frame = False
        kept.append(line)
    return kept


def scrub_data(value: Any, *, drop_keys: frozenset[str] = frozenset({"traceback", "stack", "exc_info"})) -> Any:
    """An event's `data` with every string scrubbed and traceback-carrying keys dropped."""
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, dict):
        return {key: scrub_data(item, drop_keys=drop_keys) for key, item in value.items() if key not in drop_keys}
    if isinstance(value, (list, tuple)):
        return [scrub_data(item, drop_keys=drop_keys) for item in value]
    return value
