"""Checks on the pieces every shape is made of: one message, a conversation, tool
definitions and tool calls. Each raises a `DataIssue` naming the line, the field
(e.g. `messages[2].tool_calls[0].function.name`) and a short excerpt of the value;
`data/shapes.py` puts them together into whole records.
"""

from __future__ import annotations

import re
from typing import Any

from tuneforge.data.cells import JSONDecodeError, dumps, loads
from tuneforge.data.example import DataIssue, excerpt_of

ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
_MESSAGE_KEYS = frozenset({"role", "content", "weight", "name", "tool_calls", "tool_call_id"})
_TOOL_CALL_KEYS = frozenset({"id", "type", "function"})
_CALLED_FUNCTION_KEYS = frozenset({"name", "arguments"})
_TOOL_KEYS = frozenset({"type", "function"})
_FUNCTION_KEYS = frozenset({"name", "description", "parameters", "strict"})
_FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for function names


def issue(code: str, message: str, line: int, field: str | None = None, value: Any = None) -> DataIssue:
    return DataIssue(code, message, line=line, field=field, excerpt=None if value is None else excerpt(value))


def excerpt(value: Any) -> str:
    """The offending value as the user wrote it: JSON, not a Python repr."""
    if isinstance(value, str):
        return excerpt_of(value)
    try:
        return excerpt_of(dumps(value).decode())
    except TypeError:  # not JSON-serialisable (e.g. a Parquet timestamp)
        return excerpt_of(value)


def _a(word: str) -> str:
    return f"an {word}" if word[:1] in ("a", "e", "i", "o", "u") else f"a {word}"


def known_keys(record: dict[str, Any], allowed: frozenset[str], what: str, line: int,
                where: str | None = None) -> None:
    for key in record:
        if key not in allowed:
            unknown = sorted(str(k) for k in record if k not in allowed)
            prefix = f"{where}: " if where else ""
            raise issue("unknown_key", f"{prefix}unknown key(s) {', '.join(unknown)} in {what}; "
                         f"allowed: {', '.join(sorted(allowed))}", line, _join(where, unknown[0]), ", ".join(unknown))


def _join(where: str | None, key: str) -> str:
    return f"{where}.{key}" if where else key


def optional_bool(record: dict[str, Any], key: str, field: str, line: int) -> None:
    value = record.get(key)
    if value is not None and not isinstance(value, bool):
        raise issue("invalid_type", f"'{field}' must be true or false", line, field, value)


def conversation(
    value: Any, where: str, line: int, warnings: list[DataIssue], tool_names: set[str] | None,
    *, prompt_only: bool,
) -> list[dict[str, Any]]:
    """Checked messages of a conversation: a whole SFT chat, or a preference prompt."""
    if type(value) is not list:
        raise issue("invalid_type", f"'{where}' must be a list of messages", line, where, value)
    if not value:
        raise issue("empty_messages", f"'{where}' is empty", line, where)
    open_calls: set[str] = set()
    seen_calls: set[str] = set()
    previous: str | None = None
    trainable = 0
    for index, message in enumerate(value):
        field = f"{where}[{index}]"
        role = message_role(message, field, line, tool_names, prompt_only=prompt_only)
        if role == "assistant":
            if previous != "user" and previous != "tool":
                raise issue("role_order", f"{field}: an assistant turn must follow a user or tool turn, not "
                             f"{_describe_previous(previous)}", line, f"{field}.role", role)
            if "tool_calls" in message:
                _register_calls(message["tool_calls"], field, line, open_calls, seen_calls)
            trainable += message.get("weight", 1)
        elif role == "tool":
            _match_tool_result(message, previous, field, line, open_calls)
        elif role != "user" and index != 0:
            raise issue("role_order", f"{field}: {_a(role)} message may only come first", line, f"{field}.role",
                         role)
        _check_empty(message, role, field, line, warnings)
        previous = role
    _check_ending(value, previous, where, line, prompt_only)
    if not prompt_only and not trainable:
        raise issue("no_trainable_turn", f"every assistant turn in '{where}' has weight 0; nothing to learn",
                     line, where)
    return value


def _describe_previous(previous: str | None) -> str:
    return "the start of the conversation" if previous is None else f"{_a(previous)} turn"


def _check_ending(messages: list[dict[str, Any]], last_role: str | None, where: str, line: int,
                  prompt_only: bool) -> None:
    field = f"{where}[{len(messages) - 1}]"
    if prompt_only and last_role not in ("user", "tool"):
        raise issue("role_order", f"a preference prompt must end with a user turn (it ends with {_a(last_role)} "
                     "turn); the answers belong in the chosen and rejected outputs", line, field, last_role)
    if not prompt_only and last_role != "assistant":
        raise issue("role_order", f"the conversation must end with an assistant turn (it ends with "
                     f"{_a(last_role)} turn)", line, field, last_role)


def _check_empty(message: dict[str, Any], role: str, where: str, line: int, warnings: list[DataIssue]) -> None:
    content = message["content"]
    if content is None or (content and not content.isspace()):
        return  # None: an assistant turn that only calls tools
    if role == "assistant" and "tool_calls" in message:
        return
    field = f"{where}.content"
    if role == "assistant" and message.get("weight", 1):
        raise issue("empty_turn", f"{field} is empty but the turn is trained on", line, field, content)
    warnings.append(DataIssue("empty_turn", f"{field} is empty", line=line, field=field,
                              excerpt=excerpt(content), severity="warning"))


def message_role(message: Any, field: str, line: int, tool_names: set[str] | None, *, prompt_only: bool) -> str:
    """Check one message in place (content parts become one string); return its role."""
    if type(message) is not dict:
        raise issue("invalid_type", f"{field} must be an object", line, field, message)
    for key in message:
        if key not in _MESSAGE_KEYS:
            known_keys(message, _MESSAGE_KEYS, "a message", line, field)
    role = message.get("role")
    if type(role) is not str or role not in ROLES:
        if role is None:
            raise issue("missing_key", f"{field} has no 'role'", line, f"{field}.role")
        raise issue("invalid_role", f"{field}.role must be one of system, developer, user, assistant, tool; "
                     f"got {excerpt_of(role, 40)}", line, f"{field}.role", role)
    content = message.get("content")
    if type(content) is not str:
        message["content"] = _content(content, message, field, line)
    if "weight" in message:
        _weight(message, role, field, line, prompt_only)
    if len(message) > 2:  # the rare keys: only when there are any beyond role and content
        _message_extras(message, role, field, line, tool_names)
    return role


def _content(content: Any, message: dict[str, Any], field: str, line: int) -> str | None:
    if content is None:
        if message.get("role") == "assistant" and message.get("tool_calls"):
            return None
        raise issue("missing_key", f"{field} has no content", line, f"{field}.content")
    if type(content) is not list:
        raise issue("invalid_type", f"{field}.content must be a string or a list of text parts", line,
                     f"{field}.content", content)
    texts = []
    for part_index, part in enumerate(content):
        part_field = f"{field}.content[{part_index}]"
        if type(part) is not dict:
            raise issue("invalid_type", f"{part_field} must be an object", line, part_field, part)
        if part.get("type") != "text":
            raise issue("unsupported_content", f"{part_field} is {_a(excerpt_of(part.get('type'), 40))} part; "
                         "only text parts are supported", line, f"{part_field}.type", part.get("type"))
        if type(part.get("text")) is not str:
            raise issue("invalid_type", f"{part_field}.text must be a string", line, f"{part_field}.text",
                         part.get("text"))
        texts.append(part["text"])
    return "".join(texts)


def _weight(message: dict[str, Any], role: str, field: str, line: int, prompt_only: bool) -> None:
    weight = message["weight"]
    if role != "assistant":
        raise issue("invalid_weight", f"{field}.weight is only allowed on assistant turns", line,
                     f"{field}.weight", weight)
    if prompt_only:
        raise issue("invalid_weight", f"{field}.weight has no meaning in a preference example", line,
                     f"{field}.weight", weight)
    if type(weight) is bool or weight not in (0, 1):
        raise issue("invalid_weight", f"{field}.weight must be 0 or 1", line, f"{field}.weight", weight)
    message["weight"] = int(weight)  # 1.0 from a float column is still 1


def _message_extras(message: dict[str, Any], role: str, field: str, line: int,
                    tool_names: set[str] | None) -> None:
    name = message.get("name")
    if name is not None and type(name) is not str:
        raise issue("invalid_type", f"{field}.name must be a string", line, f"{field}.name", name)
    if message.get("tool_calls") is not None and message["tool_calls"] != []:
        if role != "assistant":
            raise issue("invalid_tool_call", f"{field}.tool_calls is only allowed on assistant turns", line,
                         f"{field}.tool_calls")
        _tool_calls(message["tool_calls"], f"{field}.tool_calls", line, tool_names)
    elif "tool_calls" in message:
        del message["tool_calls"]  # null or [] (as some exports write) means none
    call_id = message.get("tool_call_id")
    if call_id is not None and role != "tool":
        raise issue("invalid_tool_call", f"{field}.tool_call_id belongs on tool messages only", line,
                     f"{field}.tool_call_id", call_id)


def _tool_calls(calls: Any, field: str, line: int, tool_names: set[str] | None) -> None:
    if type(calls) is not list or not calls:
        raise issue("invalid_tool_call", f"{field} must be a non-empty list", line, field, calls)
    for index, call in enumerate(calls):
        where = f"{field}[{index}]"
        if type(call) is not dict:
            raise issue("invalid_tool_call", f"{where} must be an object", line, where, call)
        known_keys(call, _TOOL_CALL_KEYS, "a tool call", line, where)
        call_id = call.get("id")
        if type(call_id) is not str or not call_id:
            raise issue("invalid_tool_call", f"{where}.id must be a non-empty string", line, f"{where}.id",
                         call_id)
        if call.get("type") != "function":
            raise issue("invalid_tool_call", f"{where}.type must be 'function'", line, f"{where}.type",
                         call.get("type"))
        _called_function(call.get("function"), f"{where}.function", line, tool_names)


def _called_function(function: Any, where: str, line: int, tool_names: set[str] | None) -> None:
    if type(function) is not dict:
        raise issue("invalid_tool_call", f"{where} must be an object with name and arguments", line, where,
                     function)
    known_keys(function, _CALLED_FUNCTION_KEYS, "a called function", line, where)
    name = function.get("name")
    if type(name) is not str or not name:
        raise issue("invalid_tool_call", f"{where}.name must be a non-empty string", line, f"{where}.name", name)
    if tool_names is not None and name not in tool_names:
        raise issue("invalid_tool_call", f"{where}.name calls '{excerpt_of(name, 64)}', which is not in "
                     "'tools'", line, f"{where}.name", name)
    arguments = function.get("arguments")
    if type(arguments) is not str:
        raise issue("invalid_tool_call", f"{where}.arguments must be a string holding JSON", line,
                     f"{where}.arguments", arguments)
    try:
        loads(arguments)
    except JSONDecodeError as exc:
        raise issue("invalid_tool_call", f"{where}.arguments is not valid JSON: {exc.msg}", line,
                     f"{where}.arguments", arguments) from None


def _register_calls(calls: list[dict[str, Any]], where: str, line: int, open_calls: set[str],
                    seen_calls: set[str]) -> None:
    for call_index, call in enumerate(calls):
        call_id = call["id"]
        if call_id in seen_calls:
            field = f"{where}.tool_calls[{call_index}].id"
            raise issue("invalid_tool_call", f"{field} repeats the id of an earlier call", line, field, call_id)
        seen_calls.add(call_id)
        open_calls.add(call_id)


def _match_tool_result(message: dict[str, Any], previous: str | None, field: str, line: int,
                       open_calls: set[str]) -> None:
    call_id = message.get("tool_call_id")
    if call_id is None:
        raise issue("missing_key", f"{field} is a tool message without 'tool_call_id'", line,
                     f"{field}.tool_call_id")
    if type(call_id) is not str:
        raise issue("invalid_type", f"{field}.tool_call_id must be a string", line, f"{field}.tool_call_id",
                     call_id)
    if previous != "assistant" and previous != "tool":
        raise issue("role_order", f"{field}: a tool message must follow the assistant turn that called the "
                     f"tool, not {_describe_previous(previous)}", line, f"{field}.role", "tool")
    if call_id not in open_calls:
        raise issue("unmatched_tool_result", f"{field}.tool_call_id {excerpt_of(call_id, 64)!r} matches no "
                     "earlier unanswered tool call", line, f"{field}.tool_call_id", call_id)
    open_calls.discard(call_id)


def tool_definitions(tools: Any, where: str, line: int) -> tuple[list[dict[str, Any]] | None, set[str] | None]:
    """The checked `tools` list and its function names; (None, None) when absent."""
    if tools is None:
        return None, None
    if type(tools) is not list:
        raise issue("invalid_type", f"'{where}' must be a list", line, where, tools)
    names: set[str] = set()
    for index, tool in enumerate(tools):
        field = f"{where}[{index}]"
        if type(tool) is not dict:
            raise issue("invalid_tool", f"{field} must be an object", line, field, tool)
        known_keys(tool, _TOOL_KEYS, "a tool", line, field)
        if tool.get("type") != "function":
            raise issue("invalid_tool", f"{field}.type must be 'function'", line, f"{field}.type", tool.get("type"))
        names.add(_tool_function(tool.get("function"), f"{field}.function", line, names))
    return tools, names


def _tool_function(function: Any, where: str, line: int, names: set[str]) -> str:
    if type(function) is not dict:
        raise issue("invalid_tool", f"{where} must be an object", line, where, function)
    known_keys(function, _FUNCTION_KEYS, "a function", line, where)
    name = function.get("name")
    if type(name) is not str or not _FUNCTION_NAME.fullmatch(name):
        raise issue("invalid_tool", f"{where}.name must be 1-64 letters, digits, '_' or '-'", line,
                     f"{where}.name", name)
    if name in names:
        raise issue("invalid_tool", f"{where}.name '{name}' is defined twice", line, f"{where}.name", name)
    for key, kind, kind_name in (("description", str, "a string"), ("parameters", dict, "an object"),
                                 ("strict", bool, "true or false")):
        if key in function and not isinstance(function[key], kind):
            raise issue("invalid_tool", f"{where}.{key} must be {kind_name}", line, f"{where}.{key}",
                         function[key])
    return name
