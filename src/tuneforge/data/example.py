"""The canonical training example every input format and shape turns into,
and the issue type every data check reports.

Formats (JSONL, CSV, Parquet, saved HF datasets) are read by `formats`;
shapes (chat, instruction, preference, text) are recognised and normalised by
`shapes`; everything after that — token counting, dedup, contamination, PII,
tokenization for training — sees only `Example`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Kind = str  # "chat", "instruction", "preference", "text", or a kind a training method brings
Severity = Literal["error", "warning"]

# Which kinds a training method accepts is the method's own (`tuneforge.methods`); a
# method may bring a kind of its own (`data.shapes.Shape`).


@dataclass
class Example:
    """One normalised example. Which fields are set depends on `kind`:

    - chat: `messages` (each {"role", "content", and optionally "weight",
      "tool_calls", "tool_call_id", "name"}), optional `tools`;
    - instruction: `prompt`, `completion`;
    - preference: `messages` (the prompt conversation, ending with a user
      turn), `chosen` and `rejected` (one assistant message dict each);
    - text: `text`;
    - prompt (reinforcement): `messages` ending with a user turn, optional `tools`, and
      `item`, the line's other fields.
    """

    line: int
    kind: Kind
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    prompt: str | None = None
    completion: str | None = None
    chosen: dict[str, Any] | None = None
    rejected: dict[str, Any] | None = None
    text: str | None = None
    item: dict[str, Any] | None = None  # prompt: the line's other fields, which graders read

    def texts(self) -> list[str]:
        """Every piece of natural-language content, in order (for dedup, PII, contamination)."""
        parts: list[str] = []
        for message in self.messages or []:
            parts.append(_content_text(message.get("content")))
        if self.prompt is not None:
            parts.append(self.prompt)
        if self.completion is not None:
            parts.append(self.completion)
        for message in (self.chosen, self.rejected):
            if message is not None:
                parts.append(_content_text(message.get("content")))
        if self.text is not None:
            parts.append(self.text)
        return [p for p in parts if p]

    def joined_text(self) -> str:
        return "\n".join(self.texts())


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(content)


@dataclass
class DataIssue(Exception):
    """A problem with the data: a code, a message, where it is, and a short excerpt.

    `line` is 1-based (the JSONL line, CSV record, or Parquet/Arrow row + 1);
    0 means the whole file. `field` is the path inside the example, e.g.
    `messages[2].role`.
    """

    code: str
    message: str
    line: int = 0
    field: str | None = None
    excerpt: str | None = None
    severity: Severity = "error"

    def __str__(self) -> str:
        where = f"line {self.line}: " if self.line else ""
        return f"{where}{self.message} [{self.code}]"

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "line": self.line, "field": self.field,
                "excerpt": self.excerpt, "severity": self.severity}


def excerpt_of(value: Any, limit: int = 120) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass
class Finding:
    """A content finding on one example (duplicate, contamination, PII)."""

    line: int
    kind: str  # e.g. "exact_duplicate", "near_duplicate", "contamination", "pii:email"
    detail: dict[str, Any] = field(default_factory=dict)
