"""shapes: every shape normalised, every problem with its exact code and field."""

from __future__ import annotations

import copy
import random
import re
from pathlib import Path
from typing import Any

import pytest

from tuneforge import methods
from tuneforge.data import codes
from tuneforge.data.example import DataIssue, Example
from tuneforge.data.shapes import MethodFit, check_method, check_required_fields, normalize, skipped_kinds
from tuneforge.domain.errors import ApiError


def user(content: Any = "Hi", **extra: Any) -> dict[str, Any]:
    return {"role": "user", "content": content, **extra}


def assistant(content: Any = "Hello", **extra: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": content, **extra}


def tool(call_id: str, content: str = "18C") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def call(call_id: str, name: str = "get_weather", arguments: Any = "{}") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


def ok(record: dict[str, Any]) -> tuple[Example, list[DataIssue]]:
    return normalize(copy.deepcopy(record), 7)


def error(record: dict[str, Any], skip: frozenset[str] = frozenset()) -> DataIssue:
    with pytest.raises(DataIssue) as caught:
        normalize(copy.deepcopy(record), 7, skip)
    assert caught.value.line == 7
    assert caught.value.severity == "error"
    return caught.value


def assert_error(record: dict[str, Any], code: str, field: str | None, skip: frozenset[str] = frozenset()) -> DataIssue:
    issue = error(record, skip)
    assert (issue.code, issue.field) == (code, field), issue
    return issue


# --- chat ------------------------------------------------------------------------------


def test_chat_is_normalised_in_place() -> None:
    record = {"messages": [{"role": "developer", "content": "Be brief."},
                           user([{"type": "text", "text": "Two "}, {"type": "text", "text": "parts"}]),
                           assistant("Hello", weight=1.0, tool_calls=None)]}
    example, warnings = ok(record)
    assert (example.kind, example.line, warnings) == ("chat", 7, [])
    assert example.messages == [{"role": "developer", "content": "Be brief."}, user("Two parts"),
                                assistant("Hello", weight=1)]
    assert type(example.messages[2]["weight"]) is int
    assert example.texts() == ["Be brief.", "Two parts", "Hello"]


def test_chat_with_tools_round_trip() -> None:
    record = {"messages": [user("Weather in Paris and Rome?"),
                           assistant(None, tool_calls=[call("a", arguments='{"city": "Paris"}'), call("b")]),
                           tool("a"), tool("b", "20C"), assistant("Paris 18C, Rome 20C."),
                           user("And tomorrow?"), assistant("", tool_calls=[call("c")])],
              "tools": [WEATHER], "parallel_tool_calls": True}
    example, warnings = ok(record)
    assert example.tools == [WEATHER]
    assert example.messages[1]["content"] is None
    assert warnings == []


@pytest.mark.parametrize(
    ("messages", "code", "field"),
    [
        ([assistant(), user(), assistant()], "role_order", "messages[0].role"),
        ([{"role": "system", "content": "s"}, assistant()], "role_order", "messages[1].role"),
        ([user(), {"role": "system", "content": "s"}, assistant()], "role_order", "messages[1].role"),
        ([user(), assistant(), assistant()], "role_order", "messages[2].role"),
        ([user(), assistant(), user()], "role_order", "messages[2]"),
        ([user()], "role_order", "messages[0]"),
        ([user(), assistant(weight=0)], "no_trainable_turn", "messages"),
        ([user(weight=1), assistant()], "invalid_weight", "messages[0].weight"),
        ([user(), assistant(weight=0.5)], "invalid_weight", "messages[1].weight"),
        ([user(), assistant(weight=False)], "invalid_weight", "messages[1].weight"),
        ([user(), assistant(weight=None)], "invalid_weight", "messages[1].weight"),
        ([user(), assistant("  \n")], "empty_turn", "messages[1].content"),
        ([user(), {"role": "bot", "content": "x"}], "invalid_role", "messages[1].role"),
        ([user(), {"role": 3, "content": "x"}], "invalid_role", "messages[1].role"),
        ([user(), {"content": "x"}], "missing_key", "messages[1].role"),
        ([{"role": "user"}, assistant()], "missing_key", "messages[0].content"),
        ([user(None), assistant()], "missing_key", "messages[0].content"),
        ([user({"text": "x"}), assistant()], "invalid_type", "messages[0].content"),
        ([user([{"type": "text", "text": 5}]), assistant()], "invalid_type", "messages[0].content[0].text"),
        ([user(["x"]), assistant()], "invalid_type", "messages[0].content[0]"),
        ([user([{"type": "input_audio"}]), assistant()], "unsupported_content", "messages[0].content[0].type"),
        ([user(name=5), assistant()], "invalid_type", "messages[0].name"),
        ([user(refusal=None), assistant()], "unknown_key", "messages[0].refusal"),
        (["hi", assistant()], "invalid_type", "messages[0]"),
    ],
)
def test_chat_errors(messages: list[Any], code: str, field: str) -> None:
    # in a file of chats: a conversation that ends with the user's turn is a chat's mistake, not a prompt
    assert_error({"messages": messages}, code, field, skipped_kinds(None, "chat"))


def test_a_conversation_ending_with_the_users_turn_is_a_prompt_with_its_other_fields_as_the_item() -> None:
    example, warnings = normalize({"messages": [user(), assistant(), user("And?")], "answer": "4", "n": [1]}, 3)
    assert (example.kind, example.line, example.item, warnings) == ("prompt", 3, {"answer": "4", "n": [1]}, [])
    assert [m["role"] for m in example.messages] == ["user", "assistant", "user"]
    # a method that does not train on prompts sees the chat's own error
    fit = MethodFit("supervised", ("chat", "instruction"))
    assert error({"messages": [user()]}, skipped_kinds(fit, None)).code == "role_order"
    assert error({"messages": [user()], **{f"f{n}": n for n in range(300)}}).code == "too_many_fields"


def test_a_method_needing_fields_refuses_the_line_without_one() -> None:
    example, _ = normalize({"messages": [user()], "answer": "4"}, 7)
    check_required_fields(example, MethodFit("reinforcement", ("prompt",), ("answer",)))
    with pytest.raises(DataIssue) as caught:
        check_required_fields(example, MethodFit("reinforcement", ("prompt",), ("answer", "units")))
    assert (caught.value.code, caught.value.line, caught.value.field) == ("missing_field", 7, "units")


@pytest.mark.parametrize(
    ("messages", "code", "field"),
    [
        ([user(), assistant(None, tool_calls="a")], "invalid_tool_call", "messages[1].tool_calls"),
        ([user(), assistant(None, tool_calls=[])], "missing_key", "messages[1].content"),
        ([user(), assistant(None, tool_calls=["a"])], "invalid_tool_call", "messages[1].tool_calls[0]"),
        ([user(), assistant(None, tool_calls=[{**call("a"), "index": 0}])], "unknown_key",
         "messages[1].tool_calls[0].index"),
        ([user(), assistant(None, tool_calls=[{**call("a"), "type": "code"}])], "invalid_tool_call",
         "messages[1].tool_calls[0].type"),
        ([user(), assistant(None, tool_calls=[{"id": "a", "type": "function"}])], "invalid_tool_call",
         "messages[1].tool_calls[0].function"),
        ([user(), assistant(None, tool_calls=[call("a", name="")])], "invalid_tool_call",
         "messages[1].tool_calls[0].function.name"),
        ([user(), assistant(None, tool_calls=[call("a", arguments="{nope")])], "invalid_tool_call",
         "messages[1].tool_calls[0].function.arguments"),
        ([user(), assistant(None, tool_calls=[call("a")]), tool("a"), assistant(None, tool_calls=[call("a")])],
         "invalid_tool_call", "messages[3].tool_calls[0].id"),
        ([user(), assistant(None), tool("a"), assistant()], "missing_key", "messages[1].content"),
        ([user(tool_call_id="a"), assistant()], "invalid_tool_call", "messages[0].tool_call_id"),
        ([user(), assistant(None, tool_calls=[call("a")]), tool("a"), tool("a"), assistant()],
         "unmatched_tool_result", "messages[3].tool_call_id"),
        ([user(), assistant(None, tool_calls=[call("a")]), {"role": "tool", "tool_call_id": 1, "content": "x"}],
         "invalid_type", "messages[2].tool_call_id"),
        ([user(), assistant(None, tool_calls=[call("a")]), user(), tool("a"), assistant()], "role_order",
         "messages[3].role"),
    ],
)
def test_tool_call_errors(messages: list[Any], code: str, field: str) -> None:
    assert_error({"messages": messages}, code, field)


@pytest.mark.parametrize(
    ("tools", "code", "field"),
    [
        ({"type": "function"}, "invalid_type", "tools"),
        (["get_weather"], "invalid_tool", "tools[0]"),
        ([{"type": "function"}], "invalid_tool", "tools[0].function"),
        ([{"type": "function", "function": {"name": "get weather"}}], "invalid_tool", "tools[0].function.name"),
        ([WEATHER, WEATHER], "invalid_tool", "tools[1].function.name"),
        ([{"type": "function", "function": {"name": "f", "parameters": "{}"}}], "invalid_tool",
         "tools[0].function.parameters"),
        ([{"type": "function", "function": {"name": "f", "returns": {}}}], "unknown_key",
         "tools[0].function.returns"),
        ([{**WEATHER, "extra": 1}], "unknown_key", "tools[0].extra"),
    ],
)
def test_tools_errors(tools: Any, code: str, field: str) -> None:
    assert_error({"messages": [user(), assistant()], "tools": tools}, code, field)


def test_call_of_a_function_not_in_tools() -> None:
    issue = assert_error({"messages": [user(), assistant(None, tool_calls=[call("a", name="get_time")])],
                          "tools": [WEATHER]}, "invalid_tool_call", "messages[1].tool_calls[0].function.name")
    assert "get_time" in issue.message and issue.excerpt == "get_time"


def test_two_calls_in_a_turn_need_parallel_tool_calls() -> None:
    two_calls = [user(), assistant(None, tool_calls=[call("a"), call("b")]),
                 {"role": "tool", "tool_call_id": "a", "content": "sunny"},
                 {"role": "tool", "tool_call_id": "b", "content": "rain"}, assistant("Mixed.")]
    issue = assert_error({"messages": two_calls, "tools": [WEATHER], "parallel_tool_calls": False},
                         "invalid_tool_call", "messages[1].tool_calls")
    assert "2 tool calls" in issue.message
    for allowed in (True, None):
        record = {"messages": two_calls, "tools": [WEATHER]}
        if allowed is not None:
            record["parallel_tool_calls"] = allowed
        assert ok(record)[0].kind == "chat"


def test_empty_turns_that_are_not_trained_are_warnings() -> None:
    _, warnings = ok({"messages": [{"role": "system", "content": ""}, user(" "), assistant("", weight=0),
                                   user("again"), assistant("Yes")]})
    assert [(w.code, w.field, w.severity, w.line) for w in warnings] == [
        ("empty_turn", "messages[0].content", "warning", 7), ("empty_turn", "messages[1].content", "warning", 7),
        ("empty_turn", "messages[2].content", "warning", 7)]


@pytest.mark.parametrize(
    ("record", "code", "field"),
    [
        ({"messages": "hi"}, "invalid_type", "messages"),
        ({"messages": None}, "invalid_type", "messages"),
        ({"messages": []}, "empty_messages", "messages"),
        ({"messages": [user(), assistant()], "metadata": {}}, "unknown_key", "metadata"),
        ({"messages": [user(), assistant()], "parallel_tool_calls": 1}, "invalid_type", "parallel_tool_calls"),
    ],
)
def test_chat_record_errors(record: dict[str, Any], code: str, field: str) -> None:
    assert_error(record, code, field)


def test_unknown_keys_are_all_named() -> None:
    issue = assert_error({"messages": [user(), assistant()], "b_meta": 1, "a_id": 2}, "unknown_key", "a_id")
    assert "a_id, b_meta" in issue.message and issue.excerpt == "a_id, b_meta"


def test_excerpts_show_json_not_python() -> None:
    assert error({"messages": [user(), assistant(weight=True)]}).excerpt == "true"


# --- instruction and text -------------------------------------------------------------------


def test_instruction() -> None:
    example, warnings = ok({"prompt": "2+2?", "completion": "4"})
    assert (example.kind, example.prompt, example.completion, warnings) == ("instruction", "2+2?", "4", [])
    example, warnings = ok({"prompt": "", "completion": "Once upon a time"})
    assert [(w.code, w.field, w.severity) for w in warnings] == [("empty_prompt", "prompt", "warning")]


@pytest.mark.parametrize(
    ("record", "code", "field"),
    [
        ({"prompt": "a"}, "missing_key", "completion"),
        ({"completion": "a"}, "missing_key", "prompt"),
        ({"prompt": 1, "completion": "a"}, "invalid_type", "prompt"),
        ({"prompt": "a", "completion": None}, "invalid_type", "completion"),
        ({"prompt": "a", "completion": "\t "}, "empty_completion", "completion"),
        ({"prompt": "a", "completion": "b", "id": 3}, "unknown_key", "id"),
    ],
)
def test_instruction_errors(record: dict[str, Any], code: str, field: str) -> None:
    assert_error(record, code, field)


def test_text() -> None:
    example, _ = ok({"text": "A document."})
    assert (example.kind, example.text) == ("text", "A document.")
    assert_error({"text": " "}, "empty_text", "text")
    assert_error({"text": 3}, "invalid_type", "text")
    assert_error({"text": "a", "source": "web"}, "unknown_key", "source")


def test_unknown_shape_lists_what_it_found_and_what_fits() -> None:
    issue = assert_error({"question": "a", "answer": "b"}, "unknown_shape", None)
    assert "found keys: answer, question" in issue.message
    assert "{prompt, completion}" in issue.message


# --- preference ---------------------------------------------------------------------------------


def dpo(messages: list[Any] | None = None, preferred: Any = None, rejected: Any = None, **extra: Any) -> dict:
    return {"input": {"messages": [user()] if messages is None else messages, **extra},
            "preferred_output": [assistant("Good")] if preferred is None else preferred,
            "non_preferred_output": [assistant("Bad")] if rejected is None else rejected}


def test_openai_dpo() -> None:
    example, warnings = ok(dpo([{"role": "system", "content": "Be kind."}, user()], tools=[WEATHER]))
    assert warnings == []
    assert example.kind == "preference"
    assert example.messages == [{"role": "system", "content": "Be kind."}, user()]
    assert (example.chosen, example.rejected, example.tools) == (assistant("Good"), assistant("Bad"), [WEATHER])


def test_dpo_prompt_may_end_with_a_tool_result() -> None:
    example, _ = ok(dpo([user(), assistant(None, tool_calls=[call("a")]), tool("a")]))
    assert example.messages[-1]["role"] == "tool"


@pytest.mark.parametrize(
    ("record", "code", "field"),
    [
        (dpo(preferred=[assistant("A"), assistant("B")]), "invalid_preference", "preferred_output"),
        (dpo(rejected=[]), "invalid_preference", "non_preferred_output"),
        (dpo(preferred=assistant("A")), "invalid_type", "preferred_output"),
        (dpo(preferred=[user("A")]), "invalid_preference", "preferred_output[0].role"),
        (dpo(preferred=[assistant("A", weight=1)]), "invalid_weight", "preferred_output[0].weight"),
        (dpo(rejected=[assistant(" ")]), "empty_turn", "non_preferred_output[0].content"),
        (dpo(rejected=[assistant("Good")]), "identical_preference", "non_preferred_output"),
        (dpo([user(), assistant()]), "role_order", "input.messages[1]"),
        (dpo([user(), assistant(weight=0), user()]), "invalid_weight", "input.messages[1].weight"),
        (dpo([]), "empty_messages", "input.messages"),
        (dpo(seed=1), "unknown_key", "input.seed"),
        ({"input": {"tools": []}, "preferred_output": [], "non_preferred_output": []}, "missing_key",
         "input.messages"),
        ({"input": [user()], "preferred_output": [], "non_preferred_output": []}, "invalid_type", "input"),
        ({"input": {"messages": [user()]}, "preferred_output": [assistant()]}, "missing_key",
         "non_preferred_output"),
        ({**dpo(), "chosen": "x"}, "unknown_key", "chosen"),
    ],
)
def test_dpo_errors(record: dict[str, Any], code: str, field: str) -> None:
    assert_error(record, code, field)


@pytest.mark.parametrize(
    ("chosen", "rejected"),
    [("Good", "Bad"), (assistant("Good"), assistant("Bad")), ([assistant("Good")], [assistant("Bad")])],
)
def test_pairs_normalise_to_messages_and_answers(chosen: Any, rejected: Any) -> None:
    example, _ = ok({"prompt": "Hi", "chosen": chosen, "rejected": rejected})
    assert example.messages == [user("Hi")]
    assert (example.chosen, example.rejected) == (assistant("Good"), assistant("Bad"))


def test_pairs_with_a_conversational_prompt() -> None:
    example, _ = ok({"prompt": [{"role": "system", "content": "s"}, user()], "chosen": "A", "rejected": "B"})
    assert [m["role"] for m in example.messages] == ["system", "user"]


def test_pairs_empty_prompt_is_a_warning() -> None:
    _, warnings = ok({"prompt": "", "chosen": "A", "rejected": "B"})
    assert [(w.code, w.field, w.severity) for w in warnings] == [("empty_turn", "prompt", "warning")]


@pytest.mark.parametrize(
    ("record", "code", "field"),
    [
        ({"prompt": "Hi", "chosen": "Same", "rejected": " Same\n"}, "identical_preference", "rejected"),
        ({"prompt": "Hi", "chosen": "", "rejected": "B"}, "empty_turn", "chosen"),
        ({"prompt": "Hi", "chosen": [assistant("A"), assistant("B")], "rejected": "B"}, "invalid_preference",
         "chosen"),
        ({"prompt": "Hi", "chosen": user("A"), "rejected": "B"}, "invalid_preference", "chosen.role"),
        ({"prompt": "Hi", "chosen": 5, "rejected": "B"}, "invalid_type", "chosen"),
        ({"prompt": 5, "chosen": "A", "rejected": "B"}, "invalid_type", "prompt"),
        ({"prompt": [user(), assistant()], "chosen": "A", "rejected": "B"}, "role_order", "prompt[1]"),
        ({"chosen": "A", "rejected": "B"}, "missing_key", "prompt"),
        ({"prompt": "Hi", "chosen": "A", "rejected": "B", "completion": "C"}, "unknown_key", "completion"),
        ({"messages": [user()], "chosen": "A", "rejected": "B"}, "unknown_key", "messages"),
    ],
)
def test_pair_errors(record: dict[str, Any], code: str, field: str) -> None:
    assert_error(record, code, field)


# --- robustness -----------------------------------------------------------------------------

SEEDS = [
    {"messages": [{"role": "system", "content": "s"}, user([{"type": "text", "text": "t"}]),
                  assistant(None, tool_calls=[call("a")]), tool("a"), assistant("x", weight=1)],
     "tools": [WEATHER], "parallel_tool_calls": True},
    {"input": {"messages": [user()], "tools": [WEATHER]}, "preferred_output": [assistant("A")],
     "non_preferred_output": [assistant("B")]},
    {"prompt": [user()], "chosen": [assistant("A")], "rejected": assistant("B")},
    {"prompt": "p", "completion": "c"},
    {"text": "t"},
]
ODD_VALUES = [None, True, 0, 1, 2.5, -1, "", " ", "x", [], [None], {}, {"role": "user"}, [[]], {"a": [1]}]


def mutate(value: Any, rng: random.Random) -> Any:
    """`value` with one randomly chosen node replaced by an odd value."""
    if isinstance(value, dict) and value and rng.random() < 0.8:
        key = rng.choice(list(value))
        return {**value, key: mutate(value[key], rng)}
    if isinstance(value, list) and value and rng.random() < 0.8:
        index = rng.randrange(len(value))
        return value[:index] + [mutate(value[index], rng)] + value[index + 1:]
    return rng.choice(ODD_VALUES)


def test_any_malformed_record_gets_a_data_issue_never_a_crash() -> None:
    rng = random.Random(1234)
    outcomes: set[str] = set()
    for _ in range(5000):
        record = mutate(copy.deepcopy(rng.choice(SEEDS)), rng)
        if not isinstance(record, dict):
            continue
        try:
            normalize(record, 1)
            outcomes.add("ok")
        except DataIssue as issue:
            assert issue.code in codes.CODES
            outcomes.add(issue.code)
    assert len(outcomes) >= 15


# --- methods and codes -------------------------------------------------------------------------


@pytest.mark.parametrize(("method", "kinds"), [(m.name, m.data_kinds) for m in methods.all_methods()])
def test_check_method(method: str, kinds: tuple[str, ...]) -> None:
    for kind in ("chat", "instruction", "preference", "text"):
        if kind in kinds:
            check_method(kind, methods.get(method).fit)
            continue
        with pytest.raises(DataIssue) as caught:
            check_method(kind, methods.get(method).fit, line=4)
        assert (caught.value.code, caught.value.line) == ("shape_mismatch", 4)
        assert f"method '{method}' needs" in caught.value.message and kind in caught.value.message


def test_check_method_names_what_dpo_needs() -> None:
    with pytest.raises(DataIssue) as caught:
        check_method("chat", methods.get("dpo").fit)
    assert "{input, preferred_output, non_preferred_output}" in caught.value.message
    with pytest.raises(ApiError) as unknown:  # a method the catalogue does not have is the request's error
        methods.get("rlhf")
    assert unknown.value.param == "method.type"


# The modules of reading and structure; the content checks (dedup, PII, ...) own their codes.
STRUCTURE_MODULES = ("shapes.py", "messages.py", "formats.py", "columnar.py", "archives.py", "compression.py",
                     "cells.py", "structure.py")


def test_every_code_raised_in_reading_and_structure_is_documented() -> None:
    package = Path(codes.__file__).parent
    raised: set[str] = set()
    for name in STRUCTURE_MODULES:
        raised |= set(re.findall(r'(?:DataIssue|\bissue)\(\s*"([a-z_]+)"', (package / name).read_text()))
    assert raised - set(codes.CODES) == set()
    assert set(codes.CODES) - raised == set()  # and nothing documented that is never raised
    assert all(description.strip() for description in codes.CODES.values())
