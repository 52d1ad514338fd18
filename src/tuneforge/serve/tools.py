"""Function calling: tools shown to the model through its chat template, calls read back from its text.

A chat template that takes `tools` (Llama 3.1+, Qwen 2.5+, Mistral, Hermes, ...) renders them
its own way. One that does not gets them described in the system message, with the call format
this module reads. What the model writes is searched for calls in the formats the common
templates teach: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks (Hermes, Qwen),
`[TOOL_CALLS] [{...}]` (Mistral), or a reply that is one JSON object naming a tool with its
`arguments` or `parameters` (Llama 3). Anything else is plain content.

`tool_choice` "required" or a named function forces a call: the reply is decoded as one JSON
object (serve/constrained.py) and checked against the call's schema, as `json_schema` answers are.
"""

from __future__ import annotations

import json
import re
import secrets
from typing import Any

from tuneforge.domain.errors import invalid
from tuneforge.serve import json_schema
from tuneforge.serve.json_schema import json_size_bytes

MAX_TOOLS = 128  # as OpenAI
# All the tools' `parameters` schemas of one request, as compact JSON: each is checked on the event
# loop (a few milliseconds for one of serve/json_schema.MAX_SCHEMA_BYTES), so their sum is bounded too.
MAX_TOOLS_SCHEMA_BYTES = 256 * 1024
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_TAGGED = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_MISTRAL = re.compile(r"\[TOOL_CALLS\]\s*(\[.*\])", re.DOTALL)


def check_tools(tools: list[Any] | None) -> tuple[dict, ...]:
    """The request's function tools, checked within the bounds of serve/json_schema.py; each
    error names its field. Their parameters' meta-schema check is `api/chat_shapes.check_answer_schema`'s
    (in a thread)."""
    if not tools:
        return ()
    if len(tools) > MAX_TOOLS:
        raise invalid(f"tools holds at most {MAX_TOOLS} functions", param="tools")
    checked, names, schema_bytes = [], set(), 0
    for index, tool in enumerate(tools):
        where = f"tools.{index}"
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
            raise invalid(f"{where} must be {{\"type\": \"function\", \"function\": {{...}}}}", param=f"{where}.type")
        function = tool["function"]
        name = function.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise invalid(f"{where}.function.name must be 1-64 letters, digits, '_' or '-'",
                          param=f"{where}.function.name")
        if name in names:
            raise invalid(f"{where}.function.name {name!r} is given twice", param=f"{where}.function.name")
        names.add(name)
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict):
            raise invalid(f"{where}.function.parameters must be a JSON Schema object",
                          param=f"{where}.function.parameters")
        schema_bytes += json_size_bytes(parameters)
        if schema_bytes > MAX_TOOLS_SCHEMA_BYTES:
            raise invalid(f"the tools' parameters hold more than {MAX_TOOLS_SCHEMA_BYTES} bytes of JSON Schema "
                          "in all", param=f"{where}.function.parameters", code="schema_too_large")
        check_schema(parameters, f"{where}.function.parameters")
        description = function.get("description")
        checked.append({"type": "function", "function": {
            "name": name, "parameters": parameters,
            **({"description": description} if isinstance(description, str) else {})}})
    return tuple(checked)


def check_schema(schema: dict, param: str) -> None:
    """A tenant's schema, checked with bounded work and no reference outside it (serve/json_schema.py)."""
    json_schema.check_schema(schema, param)


def check_tool_choice(choice: Any, tools: tuple[dict, ...]) -> str:
    """"none", "auto", "required", or the name of the function the reply must call."""
    names = [tool["function"]["name"] for tool in tools]
    if choice is None:
        return "auto" if tools else "none"
    if choice in ("none", "auto", "required"):
        if choice != "none" and not tools:
            raise invalid(f"tool_choice {choice!r} needs tools", param="tool_choice")
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if name not in names:
            raise invalid(f"tool_choice names {name!r}, which is not one of the tools", param="tool_choice")
        return name
    raise invalid("tool_choice must be 'none', 'auto', 'required' or {\"type\": \"function\", \"function\": "
                  "{\"name\": ...}}", param="tool_choice")


def forced_schema(tools: tuple[dict, ...], choice: str) -> dict:
    """What a forced reply must be: the named function's arguments, or for "required" an object
    naming one of the tools with its arguments."""
    if choice != "required":
        return next(t["function"]["parameters"] for t in tools if t["function"]["name"] == choice)
    return {"type": "object", "required": ["name", "arguments"], "properties": {
        "name": {"enum": [t["function"]["name"] for t in tools]}, "arguments": {"type": "object"}}}


def forced_call(text: str, choice: str) -> list[dict]:
    """The call of a forced reply (already checked against `forced_schema`)."""
    value = json.loads(text)
    if choice == "required":
        return [_call(value["name"], value["arguments"])]
    return [_call(choice, value)]


def parse_calls(text: str, tools: tuple[dict, ...]) -> tuple[str | None, list[dict]]:
    """(content, tool calls) read from a reply; no calls: (the text, [])."""
    names = {tool["function"]["name"] for tool in tools}
    found = [_as_call(block, names) for block in _TAGGED.findall(text)]
    if found and all(found):
        rest = _TAGGED.sub("", text).strip()
        return rest or None, found  # type: ignore[return-value]
    mistral = _MISTRAL.search(text)
    if mistral:
        try:
            items = json.loads(mistral.group(1))
        except ValueError:
            items = None
        calls = [_as_call(json.dumps(item), names) for item in items] if isinstance(items, list) else []
        if calls and all(calls):
            return text[:mistral.start()].strip() or None, calls  # type: ignore[return-value]
    whole = _as_call(text.strip(), names)
    if whole is not None:
        return None, [whole]
    return text, []


def _as_call(block: str, names: set[str]) -> dict | None:
    try:
        value = json.loads(block)
    except ValueError:
        return None
    if not isinstance(value, dict) or value.get("name") not in names:
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return _call(value["name"], arguments)


def _call(name: str, arguments: dict) -> dict:
    return {"id": f"call_{secrets.token_hex(12)}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}


def describe(tools: tuple[dict, ...]) -> str:
    """The tools in words, for a chat template that does not take them."""
    listed = "\n".join(json.dumps(tool["function"], ensure_ascii=False) for tool in tools)
    return ("You can call these functions. To call one, answer with <tool_call>{\"name\": NAME, \"arguments\": "
            "{...}}</tool_call> and nothing else.\n" + listed)


def plain_messages(messages: list[dict], tools: tuple[dict, ...]) -> list[dict]:
    """A conversation with tools for a template that knows none: the tools described in the
    system message, earlier calls written out as the format above, tool results as user turns."""
    out: list[dict] = []
    for message in messages:
        if message["role"] == "assistant" and message.get("tool_calls"):
            calls = "".join("<tool_call>"
                            f"{json.dumps({'name': c['function']['name'], 'arguments': c['function']['arguments']})}"
                            "</tool_call>" for c in message["tool_calls"])
            out.append({"role": "assistant", "content": (message.get("content") or "") + calls})
        elif message["role"] == "tool":
            out.append({"role": "user", "content": f"Result of {message.get('tool_call_id', 'the call')}: "
                                                   f"{message.get('content', '')}"})
        else:
            out.append({"role": message["role"], "content": message.get("content", "")})
    if tools:
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + describe(tools)}
        else:
            out.insert(0, {"role": "system", "content": describe(tools)})
    return out
