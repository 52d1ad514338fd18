"""Grader templates: `{{item.answer}}`, `{{sample.output_text}}`, `{{sample.output_json.score}}` ...

A reference is `{{ namespace.path }}` with a dotted path of names or list
indices. Namespaces: `item` (the dataset line) and `sample` (what the model
wrote: `output_text`, `output_json` — the output parsed as JSON when it is —
`output_tools`, `choices`). A string renders as itself, anything else as
compact JSON. A reference to nothing (a field the line lacks, `output_json` of
an output that is not JSON) is an `invalid_variable` error for that sample.

Bounds: the pattern is linear (no nested quantifiers over the same text),
templates are at most 64 kB (`domain/graders.py`), a sample's text is parsed
as JSON only up to `MAX_JSON_CHARS`, and a rendered field is cut at
`MAX_RENDERED_CHARS`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

_REFERENCE = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_\-]+)*)\s*\}\}")
SAMPLE_FIELDS = ("output_text", "output_json", "output_tools", "choices")
MAX_JSON_CHARS = 1_000_000
MAX_RENDERED_CHARS = 200_000


class TemplateError(ValueError):
    """A reference that names nothing (or a namespace that does not exist)."""


@dataclass(frozen=True)
class Sample:
    """What the model produced for one item, as graders see it."""

    output_text: str
    output_json: Any = None  # the output parsed as JSON, None when it is not JSON
    output_tools: list[Any] = field(default_factory=list)

    @classmethod
    def from_text(cls, text: str, tools: list[Any] | None = None) -> Sample:
        return cls(text, parse_json(text), list(tools or []))

    def as_dict(self) -> dict[str, Any]:
        """The `sample` a python grader gets."""
        return {"output_text": self.output_text, "output_json": self.output_json, "output_tools": self.output_tools,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": self.output_text}}]}


def parse_json(text: str) -> Any:
    """`text` as JSON, or None (not JSON, too long, or nested beyond the parser's recursion limit)."""
    stripped = text.strip()
    if not stripped or len(stripped) > MAX_JSON_CHARS or stripped[0] not in "{[":
        return None
    try:
        return json.loads(stripped)
    except (ValueError, RecursionError):
        return None


def references(template: str) -> Iterator[tuple[str, ...]]:
    """The dotted paths a template names, e.g. ("item", "answer")."""
    for match in _REFERENCE.finditer(template):
        yield tuple(match.group(1).split("."))


def check(template: str) -> str | None:
    """What is wrong with a template's references (None when each names a known namespace)."""
    for path in references(template):
        if path[0] == "item":
            if len(path) < 2:
                return "{{item}} must name a field, e.g. {{item.answer}}"
        elif path[0] == "sample":
            if len(path) < 2 or path[1] not in SAMPLE_FIELDS:
                return f"{{{{{'.'.join(path)}}}}} names no sample field; use one of " + \
                    ", ".join(f"sample.{name}" for name in SAMPLE_FIELDS)
        else:
            return f"{{{{{'.'.join(path)}}}}}: templates read item.* or sample.*"
    return None


def item_fields(template: str) -> set[str]:
    """The top-level item fields a template reads (every dataset line must have them)."""
    return {path[1] for path in references(template) if path[0] == "item" and len(path) > 1}


def render(template: str, sample: Sample, item: Mapping[str, Any]) -> str:
    """The template with each reference replaced; `TemplateError` for one that names nothing."""
    namespaces = {"item": item, "sample": sample.as_dict()}

    def value(match: re.Match[str]) -> str:
        path = match.group(1).split(".")
        found = lookup(namespaces, path)
        text = found if isinstance(found, str) else json.dumps(found, ensure_ascii=False, separators=(",", ":"))
        return text[:MAX_RENDERED_CHARS]

    return _REFERENCE.sub(value, template)


def lookup(root: Mapping[str, Any], path: list[str]) -> Any:
    current: Any = root
    for depth, name in enumerate(path):
        if isinstance(current, Mapping) and name in current:
            current = current[name]
        elif isinstance(current, list) and name.isdigit() and int(name) < len(current):
            current = current[int(name)]
        else:
            raise TemplateError(f"{{{{{'.'.join(path)}}}}}: {'.'.join(path[:depth + 1])} does not exist")
        if current is None and depth < len(path) - 1:
            raise TemplateError(f"{{{{{'.'.join(path)}}}}}: {'.'.join(path[:depth + 1])} is null")
    if current is None:
        raise TemplateError(f"{{{{{'.'.join(path)}}}}} is null")
    return current
