"""What a tenant may read of text the platform did not write itself.

A trainer's report is not fully trusted: its messages can carry a Python
traceback, absolute paths of the host or the repr of an internal object.
`scrub` removes those before a message becomes a job's error or event; the
details stay in the operator's logs, under the correlation id the tenant sees.
"""

from __future__ import annotations

import re
from typing import Any

MAX_MESSAGE_CHARS = 2000
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


def scrub(text: str, max_chars: int = MAX_MESSAGE_CHARS) -> str:
    """`text` without traceback frames, absolute paths and object reprs, at most `max_chars` long."""
    if not text:
        return ""
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
