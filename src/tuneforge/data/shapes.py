"""Recognise the shape of one record and normalise it into an `Example`.

Shapes (the key that decides is in brackets; checked in this order):

- preference, OpenAI DPO [`input`, `preferred_output`, `non_preferred_output`]:
  `{input: {messages, tools?}, preferred_output: [assistant message],
  non_preferred_output: [assistant message]}`;
- preference, pairs [`chosen`, `rejected`]: `{prompt, chosen, rejected}` where
  prompt is a string (one user turn) or a list of messages, and chosen/rejected
  are strings, one assistant message, or a list holding one;
- chat [`messages`]: OpenAI chat fine-tuning format, `{messages, tools?,
  parallel_tool_calls?}`;
- instruction [`prompt`, `completion`]: `{prompt, completion}` strings;
- text [`text`]: `{text}`.

`normalize` raises a `DataIssue` (code, `field`, short `excerpt`) for the first
problem in a record and returns non-fatal ones as warnings. Codes are listed
with their meaning in `tuneforge.data.codes`.

The normalised example reuses the record's objects (messages are the same
dicts, with content parts joined into one string), so a record must not be
shared with anything else once normalised.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tuneforge.data.cells import JSONDecodeError, dumps, loads
from tuneforge.data.example import DataIssue, Example, excerpt_of

ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
_MESSAGE_KEYS = frozenset({"role", "content", "weight", "name", "tool_calls", "tool_call_id"})
_TOOL_CALL_KEYS = frozenset({"id", "type", "function"})
_CALLED_FUNCTION_KEYS = frozenset({"name", "arguments"})
_TOOL_KEYS = frozenset({"type", "function"})
_FUNCTION_KEYS = frozenset({"name", "description", "parameters", "strict"})
_FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for function names

CHAT_KEYS = frozenset({"messages", "tools", "parallel_tool_calls"})
INSTRUCTION_KEYS = frozenset({"prompt", "completion"})
DPO_KEYS = frozenset({"input", "preferred_output", "non_preferred_output"})
_DPO_INPUT_KEYS = frozenset({"messages", "tools", "parallel_tool_calls"})
PAIR_KEYS = frozenset({"prompt", "chosen", "rejected"})
TEXT_KEYS = frozenset({"text"})
KNOWN_KEYS = CHAT_KEYS | INSTRUCTION_KEYS | DPO_KEYS | PAIR_KEYS | TEXT_KEYS

# What each kind looks like, for messages that tell the user what to write.
SHAPE_HELP: dict[str, str] = {
    "chat": "{messages: [...]} (OpenAI chat)",
    "instruction": "{prompt, completion}",
    "preference": "{input, preferred_output, non_preferred_output} (OpenAI DPO) or {prompt, chosen, rejected}",
    "text": "{text}",
}


def _issue(code: str, message: str, line: int, field: str | None = None, value: Any = None) -> DataIssue:
    return DataIssue(code, message, line=line, field=field, excerpt=None if value is None else _excerpt(value))


def _excerpt(value: Any) -> str:
    """The offending value as the user wrote it: JSON, not a Python repr."""
    if isinstance(value, str):
        return excerpt_of(value)
    try:
        return excerpt_of(dumps(value).decode())
    except TypeError:  # not JSON-serialisable (e.g. a Parquet timestamp)
        return excerpt_of(value)


def _a(word: str) -> str:
    return f"an {word}" if word[:1] in ("a", "e", "i", "o", "u") else f"a {word}"


@dataclass(frozen=True)
class Shape:
    """A data shape a training method brings (`TrainingMethod.shapes`). Its records are
    recognised before the built-in shapes, so its deciding key must be one no built-in
    shape has (e.g. KTO's `label`)."""

    kind: str  # the `Example.kind` its records get
    help: str  # what a record looks like, for messages that tell the user what to write
    keys: frozenset[str]  # every top-level key a record may have (columns of a table)
    json_keys: frozenset[str]  # those whose CSV/Parquet text cells hold JSON
    claims: Callable[[dict[str, Any]], bool]  # whether a record is of this shape
    normalize: Callable[[dict[str, Any], int, list[DataIssue]], Example]  # raises DataIssue
    to_record: Callable[[Example], dict[str, Any]]  # the prepared-dataset line the trainer reads


_method_shapes: tuple[Shape, ...] | None = None


def method_shapes() -> tuple[Shape, ...]:
    """The shapes the registered training methods bring (looked up once per process)."""
    global _method_shapes
    if _method_shapes is None:
        from tuneforge.train import methods  # the registry imports this module: look it up late

        _method_shapes = tuple(shape for method in methods.all_methods() for shape in method.shapes)
    return _method_shapes


def known_keys_all() -> frozenset[str]:
    """Every top-level key some shape uses: a table needs at least one such column."""
    return KNOWN_KEYS.union(*(shape.keys for shape in method_shapes()))


def json_keys_all(builtin: frozenset[str]) -> frozenset[str]:
    """`builtin` JSON columns plus those of the methods' shapes."""
    return builtin.union(*(shape.json_keys for shape in method_shapes()))


def shape_help() -> dict[str, str]:
    return {**SHAPE_HELP, **{shape.kind: shape.help for shape in method_shapes()}}


def normalize(record: dict[str, Any], line: int) -> tuple[Example, list[DataIssue]]:
    """The `Example` for one record and its warnings; raises `DataIssue` on an error."""
    warnings: list[DataIssue] = []
    for shape in method_shapes():
        if shape.claims(record):
            return shape.normalize(record, line, warnings), warnings
    if "input" in record or "preferred_output" in record or "non_preferred_output" in record:
        _known_keys(record, DPO_KEYS, "an OpenAI DPO preference example", line)
        return _dpo_preference(record, line, warnings), warnings
    if "chosen" in record or "rejected" in record:
        _known_keys(record, PAIR_KEYS, "a {prompt, chosen, rejected} preference example", line)
        return _pair_preference(record, line, warnings), warnings
    if "messages" in record:
        _known_keys(record, CHAT_KEYS, "a chat example", line)
        return _chat(record, line, warnings), warnings
    if "prompt" in record or "completion" in record:
        _known_keys(record, INSTRUCTION_KEYS, "an instruction example", line)
        return _instruction(record, line, warnings), warnings
    if "text" in record:
        _known_keys(record, TEXT_KEYS, "a text example", line)
        return _text(record, line), warnings
    found = ", ".join(sorted(map(str, record))) or "none"
    expected = "; ".join(f"{help_text} ({kind})" for kind, help_text in shape_help().items())
    raise _issue("unknown_shape", f"no supported shape; found keys: {found}. Expected one of: {expected}",
                 line, value=record)


def kinds_for_method(method: str) -> tuple[str, ...]:
    """The example kinds `method` trains on (the method registry says)."""
    from tuneforge.train import methods

    if method not in methods.names():
        raise ValueError(f"unknown training method {method!r}; known: {', '.join(methods.names())}")
    return methods.get(method).data_kinds


def check_method(kind: str, method: str, line: int = 0) -> None:
    """Raise `shape_mismatch` unless `method` trains on examples of `kind`."""
    accepted = kinds_for_method(method)
    if kind in accepted:
        return
    help_by_kind = shape_help()
    needs = " or ".join(f"{accepted_kind} {help_by_kind[accepted_kind]}" for accepted_kind in accepted)
    raise _issue("shape_mismatch", f"method '{method}' needs {needs} examples; this file holds {kind} examples",
                 line)


def _known_keys(record: dict[str, Any], allowed: frozenset[str], what: str, line: int,
                where: str | None = None) -> None:
    for key in record:
        if key not in allowed:
            unknown = sorted(str(k) for k in record if k not in allowed)
            prefix = f"{where}: " if where else ""
            raise _issue("unknown_key", f"{prefix}unknown key(s) {', '.join(unknown)} in {what}; "
                         f"allowed: {', '.join(sorted(allowed))}", line, _join(where, unknown[0]), ", ".join(unknown))


def _join(where: str | None, key: str) -> str:
    return f"{where}.{key}" if where else key


# --- chat -------------------------------------------------------------------


def _chat(record: dict[str, Any], line: int, warnings: list[DataIssue]) -> Example:
    tools, tool_names = _tools(record.get("tools"), "tools", line)
    _optional_bool(record, "parallel_tool_calls", "parallel_tool_calls", line)
    messages = _conversation(record["messages"], "messages", line, warnings, tool_names, prompt_only=False)
    return Example(line=line, kind="chat", messages=messages, tools=tools)


def _optional_bool(record: dict[str, Any], key: str, field: str, line: int) -> None:
    value = record.get(key)
    if value is not None and not isinstance(value, bool):
        raise _issue("invalid_type", f"'{field}' must be true or false", line, field, value)


def _conversation(
    value: Any, where: str, line: int, warnings: list[DataIssue], tool_names: set[str] | None,
    *, prompt_only: bool,
) -> list[dict[str, Any]]:
    """Checked messages of a conversation: a whole SFT chat, or a preference prompt."""
    if type(value) is not list:
        raise _issue("invalid_type", f"'{where}' must be a list of messages", line, where, value)
    if not value:
        raise _issue("empty_messages", f"'{where}' is empty", line, where)
    open_calls: set[str] = set()
    seen_calls: set[str] = set()
    previous: str | None = None
    trainable = 0
    for index, message in enumerate(value):
        field = f"{where}[{index}]"
        role = _message(message, field, line, tool_names, prompt_only=prompt_only)
        if role == "assistant":
            if previous != "user" and previous != "tool":
                raise _issue("role_order", f"{field}: an assistant turn must follow a user or tool turn, not "
                             f"{_describe_previous(previous)}", line, f"{field}.role", role)
            if "tool_calls" in message:
                _register_calls(message["tool_calls"], field, line, open_calls, seen_calls)
            trainable += message.get("weight", 1)
        elif role == "tool":
            _match_tool_result(message, previous, field, line, open_calls)
        elif role != "user" and index != 0:
            raise _issue("role_order", f"{field}: {_a(role)} message may only come first", line, f"{field}.role",
                         role)
        _check_empty(message, role, field, line, warnings)
        previous = role
    _check_ending(value, previous, where, line, prompt_only)
    if not prompt_only and not trainable:
        raise _issue("no_trainable_turn", f"every assistant turn in '{where}' has weight 0; nothing to learn",
                     line, where)
    return value


def _describe_previous(previous: str | None) -> str:
    return "the start of the conversation" if previous is None else f"{_a(previous)} turn"


def _check_ending(messages: list[dict[str, Any]], last_role: str | None, where: str, line: int,
                  prompt_only: bool) -> None:
    field = f"{where}[{len(messages) - 1}]"
    if prompt_only and last_role not in ("user", "tool"):
        raise _issue("role_order", f"a preference prompt must end with a user turn (it ends with {_a(last_role)} "
                     "turn); the answers belong in the chosen and rejected outputs", line, field, last_role)
    if not prompt_only and last_role != "assistant":
        raise _issue("role_order", f"the conversation must end with an assistant turn (it ends with "
                     f"{_a(last_role)} turn)", line, field, last_role)


def _check_empty(message: dict[str, Any], role: str, where: str, line: int, warnings: list[DataIssue]) -> None:
    content = message["content"]
    if content is None or (content and not content.isspace()):
        return  # None: an assistant turn that only calls tools
    if role == "assistant" and "tool_calls" in message:
        return
    field = f"{where}.content"
    if role == "assistant" and message.get("weight", 1):
        raise _issue("empty_turn", f"{field} is empty but the turn is trained on", line, field, content)
    warnings.append(DataIssue("empty_turn", f"{field} is empty", line=line, field=field,
                              excerpt=_excerpt(content), severity="warning"))


def _message(message: Any, field: str, line: int, tool_names: set[str] | None, *, prompt_only: bool) -> str:
    """Check one message in place (content parts become one string); return its role."""
    if type(message) is not dict:
        raise _issue("invalid_type", f"{field} must be an object", line, field, message)
    for key in message:
        if key not in _MESSAGE_KEYS:
            _known_keys(message, _MESSAGE_KEYS, "a message", line, field)
    role = message.get("role")
    if type(role) is not str or role not in ROLES:
        if role is None:
            raise _issue("missing_key", f"{field} has no 'role'", line, f"{field}.role")
        raise _issue("invalid_role", f"{field}.role must be one of system, developer, user, assistant, tool; "
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
        raise _issue("missing_key", f"{field} has no content", line, f"{field}.content")
    if type(content) is not list:
        raise _issue("invalid_type", f"{field}.content must be a string or a list of text parts", line,
                     f"{field}.content", content)
    texts = []
    for part_index, part in enumerate(content):
        part_field = f"{field}.content[{part_index}]"
        if type(part) is not dict:
            raise _issue("invalid_type", f"{part_field} must be an object", line, part_field, part)
        if part.get("type") != "text":
            raise _issue("unsupported_content", f"{part_field} is {_a(excerpt_of(part.get('type'), 40))} part; "
                         "only text parts are supported", line, f"{part_field}.type", part.get("type"))
        if type(part.get("text")) is not str:
            raise _issue("invalid_type", f"{part_field}.text must be a string", line, f"{part_field}.text",
                         part.get("text"))
        texts.append(part["text"])
    return "".join(texts)


def _weight(message: dict[str, Any], role: str, field: str, line: int, prompt_only: bool) -> None:
    weight = message["weight"]
    if role != "assistant":
        raise _issue("invalid_weight", f"{field}.weight is only allowed on assistant turns", line,
                     f"{field}.weight", weight)
    if prompt_only:
        raise _issue("invalid_weight", f"{field}.weight has no meaning in a preference example", line,
                     f"{field}.weight", weight)
    if type(weight) is bool or weight not in (0, 1):
        raise _issue("invalid_weight", f"{field}.weight must be 0 or 1", line, f"{field}.weight", weight)
    message["weight"] = int(weight)  # 1.0 from a float column is still 1


def _message_extras(message: dict[str, Any], role: str, field: str, line: int,
                    tool_names: set[str] | None) -> None:
    name = message.get("name")
    if name is not None and type(name) is not str:
        raise _issue("invalid_type", f"{field}.name must be a string", line, f"{field}.name", name)
    if message.get("tool_calls") is not None and message["tool_calls"] != []:
        if role != "assistant":
            raise _issue("invalid_tool_call", f"{field}.tool_calls is only allowed on assistant turns", line,
                         f"{field}.tool_calls")
        _tool_calls(message["tool_calls"], f"{field}.tool_calls", line, tool_names)
    elif "tool_calls" in message:
        del message["tool_calls"]  # null or [] (as some exports write) means none
    call_id = message.get("tool_call_id")
    if call_id is not None and role != "tool":
        raise _issue("invalid_tool_call", f"{field}.tool_call_id belongs on tool messages only", line,
                     f"{field}.tool_call_id", call_id)


# --- tools --------------------------------------------------------------------


def _tool_calls(calls: Any, field: str, line: int, tool_names: set[str] | None) -> None:
    if type(calls) is not list or not calls:
        raise _issue("invalid_tool_call", f"{field} must be a non-empty list", line, field, calls)
    for index, call in enumerate(calls):
        where = f"{field}[{index}]"
        if type(call) is not dict:
            raise _issue("invalid_tool_call", f"{where} must be an object", line, where, call)
        _known_keys(call, _TOOL_CALL_KEYS, "a tool call", line, where)
        call_id = call.get("id")
        if type(call_id) is not str or not call_id:
            raise _issue("invalid_tool_call", f"{where}.id must be a non-empty string", line, f"{where}.id",
                         call_id)
        if call.get("type") != "function":
            raise _issue("invalid_tool_call", f"{where}.type must be 'function'", line, f"{where}.type",
                         call.get("type"))
        _called_function(call.get("function"), f"{where}.function", line, tool_names)


def _called_function(function: Any, where: str, line: int, tool_names: set[str] | None) -> None:
    if type(function) is not dict:
        raise _issue("invalid_tool_call", f"{where} must be an object with name and arguments", line, where,
                     function)
    _known_keys(function, _CALLED_FUNCTION_KEYS, "a called function", line, where)
    name = function.get("name")
    if type(name) is not str or not name:
        raise _issue("invalid_tool_call", f"{where}.name must be a non-empty string", line, f"{where}.name", name)
    if tool_names is not None and name not in tool_names:
        raise _issue("invalid_tool_call", f"{where}.name calls '{excerpt_of(name, 64)}', which is not in "
                     "'tools'", line, f"{where}.name", name)
    arguments = function.get("arguments")
    if type(arguments) is not str:
        raise _issue("invalid_tool_call", f"{where}.arguments must be a string holding JSON", line,
                     f"{where}.arguments", arguments)
    try:
        loads(arguments)
    except JSONDecodeError as exc:
        raise _issue("invalid_tool_call", f"{where}.arguments is not valid JSON: {exc.msg}", line,
                     f"{where}.arguments", arguments) from None


def _register_calls(calls: list[dict[str, Any]], where: str, line: int, open_calls: set[str],
                    seen_calls: set[str]) -> None:
    for call_index, call in enumerate(calls):
        call_id = call["id"]
        if call_id in seen_calls:
            field = f"{where}.tool_calls[{call_index}].id"
            raise _issue("invalid_tool_call", f"{field} repeats the id of an earlier call", line, field, call_id)
        seen_calls.add(call_id)
        open_calls.add(call_id)


def _match_tool_result(message: dict[str, Any], previous: str | None, field: str, line: int,
                       open_calls: set[str]) -> None:
    call_id = message.get("tool_call_id")
    if call_id is None:
        raise _issue("missing_key", f"{field} is a tool message without 'tool_call_id'", line,
                     f"{field}.tool_call_id")
    if type(call_id) is not str:
        raise _issue("invalid_type", f"{field}.tool_call_id must be a string", line, f"{field}.tool_call_id",
                     call_id)
    if previous != "assistant" and previous != "tool":
        raise _issue("role_order", f"{field}: a tool message must follow the assistant turn that called the "
                     f"tool, not {_describe_previous(previous)}", line, f"{field}.role", "tool")
    if call_id not in open_calls:
        raise _issue("unmatched_tool_result", f"{field}.tool_call_id {excerpt_of(call_id, 64)!r} matches no "
                     "earlier unanswered tool call", line, f"{field}.tool_call_id", call_id)
    open_calls.discard(call_id)


def _tools(tools: Any, where: str, line: int) -> tuple[list[dict[str, Any]] | None, set[str] | None]:
    """The checked `tools` list and its function names; (None, None) when absent."""
    if tools is None:
        return None, None
    if type(tools) is not list:
        raise _issue("invalid_type", f"'{where}' must be a list", line, where, tools)
    names: set[str] = set()
    for index, tool in enumerate(tools):
        field = f"{where}[{index}]"
        if type(tool) is not dict:
            raise _issue("invalid_tool", f"{field} must be an object", line, field, tool)
        _known_keys(tool, _TOOL_KEYS, "a tool", line, field)
        if tool.get("type") != "function":
            raise _issue("invalid_tool", f"{field}.type must be 'function'", line, f"{field}.type", tool.get("type"))
        names.add(_tool_function(tool.get("function"), f"{field}.function", line, names))
    return tools, names


def _tool_function(function: Any, where: str, line: int, names: set[str]) -> str:
    if type(function) is not dict:
        raise _issue("invalid_tool", f"{where} must be an object", line, where, function)
    _known_keys(function, _FUNCTION_KEYS, "a function", line, where)
    name = function.get("name")
    if type(name) is not str or not _FUNCTION_NAME.fullmatch(name):
        raise _issue("invalid_tool", f"{where}.name must be 1-64 letters, digits, '_' or '-'", line,
                     f"{where}.name", name)
    if name in names:
        raise _issue("invalid_tool", f"{where}.name '{name}' is defined twice", line, f"{where}.name", name)
    for key, kind, kind_name in (("description", str, "a string"), ("parameters", dict, "an object"),
                                 ("strict", bool, "true or false")):
        if key in function and not isinstance(function[key], kind):
            raise _issue("invalid_tool", f"{where}.{key} must be {kind_name}", line, f"{where}.{key}",
                         function[key])
    return name


# --- instruction and text -------------------------------------------------------


def _instruction(record: dict[str, Any], line: int, warnings: list[DataIssue]) -> Example:
    for key in ("prompt", "completion"):
        if key not in record:
            raise _issue("missing_key", f"an instruction example needs '{key}'", line, key)
        if type(record[key]) is not str:
            raise _issue("invalid_type", f"'{key}' must be a string", line, key, record[key])
    prompt, completion = record["prompt"], record["completion"]
    if not completion.strip():
        raise _issue("empty_completion", "'completion' is empty", line, "completion", completion)
    if not prompt.strip():
        warnings.append(DataIssue("empty_prompt", "'prompt' is empty", line=line, field="prompt",
                                  excerpt=_excerpt(prompt), severity="warning"))
    return Example(line=line, kind="instruction", prompt=prompt, completion=completion)


def _text(record: dict[str, Any], line: int) -> Example:
    text = record["text"]
    if type(text) is not str:
        raise _issue("invalid_type", "'text' must be a string", line, "text", text)
    if not text.strip():
        raise _issue("empty_text", "'text' is empty", line, "text", text)
    return Example(line=line, kind="text", text=text)


# --- preference -------------------------------------------------------------------


def _dpo_preference(record: dict[str, Any], line: int, warnings: list[DataIssue]) -> Example:
    for key in ("input", "preferred_output", "non_preferred_output"):
        if key not in record:
            raise _issue("missing_key", f"an OpenAI DPO example needs '{key}'", line, key)
    messages, tools, tool_names = prompt_input(record["input"], line, warnings)
    chosen = _one_answer(record["preferred_output"], "preferred_output", line, tool_names)
    rejected = _one_answer(record["non_preferred_output"], "non_preferred_output", line, tool_names)
    _check_distinct(chosen, rejected, "non_preferred_output", line)
    return Example(line=line, kind="preference", messages=messages, tools=tools, chosen=chosen, rejected=rejected)


def prompt_input(prompt: Any, line: int, warnings: list[DataIssue]) -> tuple[list[dict[str, Any]],
                                                                             list[dict[str, Any]] | None, set[str]]:
    """An OpenAI-style `input` object, `{messages, tools?, parallel_tool_calls?}`, whose
    conversation ends with a user (or tool) turn: (messages, tools, tool names)."""
    if type(prompt) is not dict:
        raise _issue("invalid_type", "'input' must be an object with 'messages'", line, "input", prompt)
    _known_keys(prompt, _DPO_INPUT_KEYS, "the input of a preference example", line, "input")
    if "messages" not in prompt:
        raise _issue("missing_key", "'input' needs 'messages'", line, "input.messages")
    tools, tool_names = _tools(prompt.get("tools"), "input.tools", line)
    _optional_bool(prompt, "parallel_tool_calls", "input.parallel_tool_calls", line)
    messages = _conversation(prompt["messages"], "input.messages", line, warnings, tool_names, prompt_only=True)
    return messages, tools, tool_names


def _pair_preference(record: dict[str, Any], line: int, warnings: list[DataIssue]) -> Example:
    for key in ("prompt", "chosen", "rejected"):
        if key not in record:
            raise _issue("missing_key", f"a preference example needs '{key}'", line, key)
    prompt = record["prompt"]
    if type(prompt) is str:
        messages = [{"role": "user", "content": prompt}]
        if not prompt.strip():
            warnings.append(DataIssue("empty_turn", "'prompt' is empty", line=line, field="prompt",
                                      excerpt=_excerpt(prompt), severity="warning"))
    elif type(prompt) is list:
        messages = _conversation(prompt, "prompt", line, warnings, None, prompt_only=True)
    else:
        raise _issue("invalid_type", "'prompt' must be a string or a list of messages", line, "prompt", prompt)
    chosen = _pair_answer(record["chosen"], "chosen", line)
    rejected = _pair_answer(record["rejected"], "rejected", line)
    _check_distinct(chosen, rejected, "rejected", line)
    return Example(line=line, kind="preference", messages=messages, chosen=chosen, rejected=rejected)


def _pair_answer(value: Any, field: str, line: int) -> dict[str, Any]:
    if type(value) is str:
        if not value.strip():
            raise _issue("empty_turn", f"'{field}' is an empty answer", line, field, value)
        return {"role": "assistant", "content": value}
    if type(value) is dict:
        return _answer_message(value, field, line, None)
    if type(value) is list:
        return _one_answer(value, field, line, None)
    raise _issue("invalid_type", f"'{field}' must be a string, an assistant message or a list holding one",
                 line, field, value)


def _one_answer(value: Any, field: str, line: int, tool_names: set[str] | None) -> dict[str, Any]:
    if type(value) is not list:
        raise _issue("invalid_type", f"'{field}' must be a list holding one assistant message", line, field, value)
    if len(value) != 1:
        raise _issue("invalid_preference", f"'{field}' must hold exactly one assistant message; it holds "
                     f"{len(value)}", line, field, value)
    return _answer_message(value[0], f"{field}[0]", line, tool_names)


def _answer_message(message: Any, field: str, line: int, tool_names: set[str] | None) -> dict[str, Any]:
    role = _message(message, field, line, tool_names, prompt_only=True)
    if role != "assistant":
        raise _issue("invalid_preference", f"{field} must be an assistant message, not {role}", line,
                     f"{field}.role", role)
    content = message["content"]
    if "tool_calls" not in message and (content is None or not content.strip()):
        raise _issue("empty_turn", f"{field} is an empty answer", line, f"{field}.content", content)
    return message


def _check_distinct(chosen: dict[str, Any], rejected: dict[str, Any], field: str, line: int) -> None:
    same_text = (chosen["content"] or "").strip() == (rejected["content"] or "").strip()
    if same_text and chosen.get("tool_calls") == rejected.get("tool_calls"):
        raise _issue("identical_preference", "the preferred and rejected answers are identical; the pair "
                     "teaches nothing", line, field, chosen["content"])


# Building blocks for the shapes methods bring (`Shape`, e.g. in train/methods/kto.py).
issue, known_keys, one_answer = _issue, _known_keys, _one_answer
