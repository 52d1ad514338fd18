"""Function calling: tools checked field by field, calls read back in the formats templates teach."""

from __future__ import annotations

import json

import pytest

from tuneforge.domain.errors import ApiError
from tuneforge.serve.tools import check_tool_choice, check_tools, forced_call, parse_calls, plain_messages

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                              "parameters": {"type": "object", "properties": {
                                                  "city": {"type": "string"}}, "required": ["city"]}}}
TOOLS = check_tools([WEATHER, {"type": "function", "function": {"name": "noop"}}])


def _calls(text: str):
    content, calls = parse_calls(text, TOOLS)
    return content, [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def test_hermes_and_qwen_tagged_calls():
    text = 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>' \
           '<tool_call>{"name": "noop", "arguments": {}}</tool_call>'
    assert _calls(text) == ("Let me look.", [("get_weather", {"city": "Oslo"}), ("noop", {})])


def test_mistral_calls():
    text = '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Lima"}}]'
    assert _calls(text) == (None, [("get_weather", {"city": "Lima"})])


def test_llama_json_reply_with_parameters_or_string_arguments():
    assert _calls('{"name": "get_weather", "parameters": {"city": "Rome"}}') == \
        (None, [("get_weather", {"city": "Rome"})])
    assert _calls('{"name": "get_weather", "arguments": "{\\"city\\": \\"Rome\\"}"}') == \
        (None, [("get_weather", {"city": "Rome"})])


@pytest.mark.parametrize("text", [
    "It is sunny.",
    '{"name": "unknown_tool", "arguments": {}}',  # not one of the tools: content
    '<tool_call>{"name": "get_weather", "arguments": [1]}</tool_call>',
    '{"city": "Oslo"}',
])
def test_anything_else_is_content(text):
    assert parse_calls(text, TOOLS) == (text, [])


def test_each_call_has_its_own_id():
    _content, calls = parse_calls('<tool_call>{"name": "noop", "arguments": {}}</tool_call>' * 2, TOOLS)
    assert len({call["id"] for call in calls}) == 2 and all(c["id"].startswith("call_") for c in calls)


@pytest.mark.parametrize("tools, param", [
    ([{"type": "retrieval"}], "tools.0.type"),
    ([{"type": "function", "function": {"name": "has space"}}], "tools.0.function.name"),
    ([WEATHER, WEATHER], "tools.1.function.name"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"$ref": "http://127.0.0.1:1/s.json"}}}],
     "tools.0.function.parameters.$ref"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"$ref": "#"}}}],
     "tools.0.function.parameters.$ref"),
])
def test_bad_tools_name_the_field(tools, param):
    with pytest.raises(ApiError) as err:
        check_tools(tools)
    assert err.value.param == param


def test_tool_choice():
    assert check_tool_choice(None, TOOLS) == "auto" and check_tool_choice(None, ()) == "none"
    assert check_tool_choice({"type": "function", "function": {"name": "noop"}}, TOOLS) == "noop"
    for bad, tools in (("required", ()), ({"type": "function", "function": {"name": "other"}}, TOOLS),
                       ("sometimes", TOOLS)):
        with pytest.raises(ApiError) as err:
            check_tool_choice(bad, tools)
        assert err.value.param == "tool_choice"
    assert forced_call('{"city": "Oslo"}', "get_weather")[0]["function"] == \
        {"name": "get_weather", "arguments": '{"city": "Oslo"}'}


def test_a_template_without_tools_gets_them_described():
    history = [{"role": "user", "content": "Weather in Oslo?"},
               {"role": "assistant", "content": "", "tool_calls": [
                   {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                                     "arguments": {"city": "Oslo"}}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "12 C"}]
    shown = plain_messages(history, TOOLS)
    assert shown[0]["role"] == "system" and "get_weather" in shown[0]["content"]
    assert "<tool_call>" in shown[2]["content"] and shown[3] == {"role": "user", "content": "Result of call_1: 12 C"}


def test_a_tool_schema_invalid_under_its_dialect_is_400_before_generation():
    import asyncio

    from tuneforge.api.chat_shapes import check_answer_schema

    tools = check_tools([WEATHER, {"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}])
    with pytest.raises(ApiError) as err:
        asyncio.run(check_answer_schema(None, tools, "auto"))
    assert err.value.param == "tools.1.function.parameters"
    asyncio.run(check_answer_schema({"type": "object"}, tools[:1], "auto"))


def test_the_tools_schemas_are_bounded_in_all():
    from tuneforge.serve.tools import MAX_TOOLS_SCHEMA_BYTES

    big = {"type": "object", "description": "d" * (MAX_TOOLS_SCHEMA_BYTES // 8 - 100)}  # 8 fit, not 9
    many = [{"type": "function", "function": {"name": f"f{i}", "parameters": big}} for i in range(10)]
    with pytest.raises(ApiError) as err:
        check_tools(many)
    assert err.value.code == "schema_too_large" and err.value.param == "tools.8.function.parameters"
