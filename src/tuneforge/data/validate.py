"""Streaming validation of an uploaded JSONL training file.

Reads line by line (bounded memory whatever the file size) and stops at the
first error, which names the line and has its own code. Shapes accepted:
chat (`messages`, OpenAI format) and instruction (`prompt`/`completion`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import IO, Any

CHAT = "chat"
PROMPT_COMPLETION = "prompt_completion"

_CHAT_KEYS = {"messages", "tools", "parallel_tool_calls", "functions"}
_PC_KEYS = {"prompt", "completion"}
_ROLES = {"system", "user", "assistant", "tool", "developer"}
_MESSAGE_KEYS = {"role", "content", "weight", "name", "tool_calls", "tool_call_id", "function_call"}
MAX_LINE_BYTES = 16 * 1024 * 1024


@dataclass
class DataError:
    line: int
    code: str
    message: str

    def describe(self) -> str:
        where = f"line {self.line}: " if self.line else ""
        return f"{where}{self.message} [{self.code}]"


@dataclass
class ValidationReport:
    data_format: str | None = None
    num_examples: int = 0
    errors: list[DataError] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors


class _Invalid(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _check_message(index: int, message: Any, is_last: bool) -> None:
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise _Invalid("invalid_message", f"{where} must be an object")
    unknown = set(message) - _MESSAGE_KEYS
    if unknown:
        raise _Invalid("unknown_key", f"{where} has unknown key(s): {', '.join(sorted(unknown))}")
    role = message.get("role")
    if role not in _ROLES:
        raise _Invalid("invalid_role", f"{where}.role must be one of system, user, assistant, tool; got {role!r}")
    content = message.get("content")
    if content is not None and not isinstance(content, (str, list)):
        raise _Invalid("invalid_type", f"{where}.content must be a string")
    if content is None and not message.get("tool_calls"):
        raise _Invalid("missing_content", f"{where} has no content")
    if "weight" in message:
        if role != "assistant":
            raise _Invalid("invalid_weight", f"{where}.weight is only allowed on assistant messages")
        if message["weight"] not in (0, 1) or isinstance(message["weight"], bool):
            raise _Invalid("invalid_weight", f"{where}.weight must be 0 or 1")


def _check_chat(record: dict) -> None:
    messages = record.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _Invalid("invalid_messages", "'messages' must be a non-empty list")
    seen_user = False
    trainable = 0
    for index, message in enumerate(messages):
        _check_message(index, message, index == len(messages) - 1)
        role = message["role"]
        if role in ("system", "developer") and index != 0:
            raise _Invalid("role_order", f"messages[{index}]: a system message may only come first")
        if role == "user":
            seen_user = True
        if role == "assistant":
            if not seen_user:
                raise _Invalid("role_order", f"messages[{index}]: an assistant message needs a user message before it")
            if message.get("weight", 1) != 0:
                trainable += 1
    if messages[-1]["role"] != "assistant":
        raise _Invalid("role_order", "the conversation must end with an assistant message")
    if trainable == 0:
        raise _Invalid("no_trainable_turn", "no assistant message has weight 1, nothing to learn")


def _check_prompt_completion(record: dict) -> None:
    for key in ("prompt", "completion"):
        if not isinstance(record.get(key), str):
            raise _Invalid("invalid_type", f"'{key}' must be a string")
    if not record["completion"].strip():
        raise _Invalid("empty_completion", "'completion' is empty")


def _shape_of(record: dict) -> str:
    if "messages" in record:
        unknown = set(record) - _CHAT_KEYS
        if unknown:
            raise _Invalid("unknown_key", f"unknown key(s) {', '.join(sorted(unknown))} in a chat example")
        return CHAT
    if "prompt" in record or "completion" in record:
        unknown = set(record) - _PC_KEYS
        if unknown:
            raise _Invalid("unknown_key", f"unknown key(s) {', '.join(sorted(unknown))} in a prompt/completion example")
        return PROMPT_COMPLETION
    raise _Invalid(
        "unknown_format",
        "each line must have 'messages' (chat) or 'prompt' and 'completion'; "
        f"found keys: {', '.join(sorted(record)) or 'none'}",
    )


def _parse_line(raw: bytes) -> dict:
    if len(raw) > MAX_LINE_BYTES:
        raise _Invalid("line_too_long", f"line is longer than {MAX_LINE_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Invalid("invalid_encoding", f"not valid UTF-8 at byte {exc.start}") from exc
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _Invalid("invalid_json", f"invalid JSON: {exc.msg} at column {exc.colno}") from exc
    if not isinstance(record, dict):
        raise _Invalid("invalid_type", f"each line must be a JSON object, got {type(record).__name__}")
    return record


def validate_jsonl(stream: IO[bytes], *, min_examples: int = 1) -> ValidationReport:
    report = ValidationReport()
    line_number = 0
    for raw in stream:
        line_number += 1
        if line_number == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]  # a UTF-8 byte-order mark is harmless
        if not raw.strip():
            continue
        try:
            record = _parse_line(raw)
            shape = _shape_of(record)
            if report.data_format is None:
                report.data_format = shape
            elif shape != report.data_format:
                raise _Invalid("mixed_formats", f"a {shape} example in a {report.data_format} file")
            _check_chat(record) if shape == CHAT else _check_prompt_completion(record)
        except _Invalid as exc:
            report.errors.append(DataError(line_number, exc.code, exc.message))
            return report
        report.num_examples += 1
    if report.num_examples == 0:
        report.errors.append(DataError(0, "empty_file", "the file holds no examples"))
    elif report.num_examples < min_examples:
        report.errors.append(
            DataError(0, "too_few_examples", f"{report.num_examples} examples; at least {min_examples} are required")
        )
    return report
