"""Loss masks, checked token by token on the demo tokenizer."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tuneforge.data.errors import BadDataError
from tuneforge.data.tokenize import IGNORE_INDEX, tokenize_example

CONVERSATION = {
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello", "weight": 0},
        {"role": "user", "content": "Code?"},
        {"role": "assistant", "content": "AB-12"},
    ]
}

# The rendered conversation split into tokens, and whether each carries loss.
# Only the weighted assistant turn counts, with its end-of-turn markup.
EXPECTED_CHAT = [
    ("<|begin_of_text|>", False), ("<|im_start|>", False), ("system", False), ("\n", False),
    ("B", False), ("e", False), (" b", False), ("ri", False), ("ef", False), (".", False),
    ("<|im_end|>", False), ("\n", False),
    ("<|im_start|>", False), ("user", False), ("\n", False), ("H", False), ("i", False),
    ("<|im_end|>", False), ("\n", False),
    ("<|im_start|>", False), ("assistant", False), ("\n", False),
    ("H", False), ("ell", False), ("o", False), ("<|im_end|>", False), ("\n", False),
    ("<|im_start|>", False), ("user", False), ("\n", False), ("C", False), ("ode", False),
    ("?", False), ("<|im_end|>", False), ("\n", False),
    ("<|im_start|>", False), ("assistant", False), ("\n", False),
    ("A", True), ("B", True), ("-", True), ("12", True), ("<|im_end|>", True), ("\n", True),
]


def _pieces(tokenizer: Any, ids: list[int]) -> list[str]:
    return [tokenizer.decode([token_id]) for token_id in ids]


def test_chat_mask_covers_only_weighted_assistant_turns(tokenizer: Any) -> None:
    example = tokenize_example(CONVERSATION, tokenizer, max_seq_length=512)
    got = [
        (piece, label != IGNORE_INDEX)
        for piece, label in zip(_pieces(tokenizer, example.input_ids), example.labels)
    ]
    assert got == EXPECTED_CHAT
    assert [label for label in example.labels if label != IGNORE_INDEX] == example.input_ids[-6:]
    assert example.num_loss_tokens == 6


def test_weight_one_on_both_turns_trains_both(tokenizer: Any) -> None:
    conversation = copy.deepcopy(CONVERSATION)
    conversation["messages"][2]["weight"] = 1
    example = tokenize_example(conversation, tokenizer, max_seq_length=512)
    trained = [piece for piece, label in zip(_pieces(tokenizer, example.input_ids), example.labels)
               if label != IGNORE_INDEX]
    assert "".join(trained) == "Hello<|im_end|>\nAB-12<|im_end|>\n"


def test_train_on_inputs_puts_loss_on_every_token(tokenizer: Any) -> None:
    example = tokenize_example(CONVERSATION, tokenizer, max_seq_length=512, train_on_inputs=True)
    assert example.labels == example.input_ids
    assert len(example.input_ids) == len(EXPECTED_CHAT)


def test_truncation_keeps_the_first_tokens(tokenizer: Any) -> None:
    full = tokenize_example(CONVERSATION, tokenizer, max_seq_length=512)
    cut = tokenize_example(CONVERSATION, tokenizer, max_seq_length=40)
    assert cut.input_ids == full.input_ids[:40]
    assert cut.labels == full.labels[:40]
    assert cut.num_loss_tokens == 2  # "A", "B" survive the cut


def test_prompt_completion_masks_the_prompt_and_appends_eos(tokenizer: Any) -> None:
    example = tokenize_example({"prompt": "Q: 2+2?", "completion": " 4"}, tokenizer, max_seq_length=64)
    assert _pieces(tokenizer, example.input_ids) == [
        "<|begin_of_text|>", "Q", ":", " 2", "+", "2", "?", " 4", "<|im_end|>",
    ]
    assert example.labels == [IGNORE_INDEX] * 7 + example.input_ids[7:]
    with_inputs = tokenize_example(
        {"prompt": "Q: 2+2?", "completion": " 4"}, tokenizer, max_seq_length=64, train_on_inputs=True
    )
    assert with_inputs.labels == with_inputs.input_ids


def test_content_as_text_parts_equals_plain_string(tokenizer: Any) -> None:
    parts = copy.deepcopy(CONVERSATION)
    parts["messages"][4]["content"] = [{"type": "text", "text": "AB-"}, {"type": "text", "text": "12"}]
    assert tokenize_example(parts, tokenizer, max_seq_length=512) == tokenize_example(
        CONVERSATION, tokenizer, max_seq_length=512
    )


def test_template_without_prefix_property_falls_back_to_content_search(tokenizer: Any) -> None:
    # This template marks the final message, so rendering a prefix of the
    # conversation is not a prefix of rendering all of it.
    odd = copy.deepcopy(tokenizer)
    odd.chat_template = (
        "{{ bos_token }}{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] }}"
        "{% if loop.last %}{{ ' (last)' }}{% endif %}{{ '<|im_end|>\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    )
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "Code?"},
        {"role": "assistant", "content": "AB-12", "weight": 0},
    ]
    example = tokenize_example({"messages": messages}, odd, max_seq_length=512)
    trained = [piece for piece, label in zip(_pieces(odd, example.input_ids), example.labels)
               if label != IGNORE_INDEX]
    # The turn and the EOS after it; the weight-0 turn stays out.
    assert "".join(trained) == "Hello<|im_end|>"


@pytest.mark.parametrize(
    ("example", "code", "param"),
    [
        ({"text": "hi"}, "invalid_example", None),
        ({"messages": []}, "invalid_example", "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "invalid_role", "messages[0].role"),
        ({"messages": [{"role": "user", "content": 3}]}, "invalid_content", "messages[0].content"),
        ({"messages": [{"role": "user", "content": "x"}]}, "missing_assistant_message", "messages"),
        (
            {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y", "weight": 2}]},
            "invalid_weight", "messages[1].weight",
        ),
        (
            {"messages": [{"role": "user", "content": "x", "weight": 1}, {"role": "assistant", "content": "y"}]},
            "invalid_weight", "messages[0].weight",
        ),
        (
            {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y", "weight": 0}]},
            "no_trainable_messages", "messages",
        ),
        ({"prompt": "x", "completion": None}, "invalid_example", "completion"),
    ],
)
def test_bad_examples_raise_data_error_naming_the_field(
    tokenizer: Any, example: dict, code: str, param: str | None
) -> None:
    with pytest.raises(BadDataError) as caught:
        tokenize_example(example, tokenizer, max_seq_length=64)
    assert caught.value.code == code
    assert caught.value.param == param


# A template that, like Qwen's and Llama 3's, shows the tool schemas in the system turn and writes an
# assistant's tool calls as JSON in its own turn.
TOOL_TEMPLATE = (
    "{{ bos_token }}{% if tools %}{{ '<|im_start|>system\nTools:' }}{% for t in tools %}"
    "{{ ' ' + t['function']['name'] + ': ' + t['function']['description'] }}{% endfor %}"
    "{% if parallel_tool_calls is defined and not parallel_tool_calls %}{{ ' (one call at a time)' }}{% endif %}"
    "{{ '<|im_end|>\n' }}{% endif %}"
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] }}"
    "{% for c in m.get('tool_calls') or [] %}"
    "{{ '<tool>' + c['function']['name'] + c['function']['arguments'] + '</tool>' }}"
    "{% endfor %}{{ '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                                 "parameters": {"type": "object", "properties": {}}}}


def _call(call_id: str, city: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": f'{{"city":"{city}"}}'}}


def _tool_example(calls: list[dict], **extra) -> dict:
    return {"messages": [{"role": "user", "content": "Weather?"},
                         {"role": "assistant", "content": "", "tool_calls": calls},
                         *({"role": "tool", "tool_call_id": call["id"], "content": "sunny"} for call in calls),
                         {"role": "assistant", "content": "Sunny."}],
            "tools": [WEATHER_TOOL], **extra}


def test_tools_reach_the_chat_template_and_tool_calls_carry_loss(tokenizer: Any) -> None:
    tooled = copy.deepcopy(tokenizer)
    tooled.chat_template = TOOL_TEMPLATE
    example = tokenize_example(_tool_example([_call("c1", "Oslo")]), tooled, max_seq_length=512)
    text = tooled.decode(example.input_ids)
    assert "Tools: get_weather: Weather in a city" in text  # the schema the model is served with
    trained = "".join(piece for piece, label in zip(_pieces(tooled, example.input_ids), example.labels)
                      if label != IGNORE_INDEX)
    # both assistant turns, the tool call included; never the schema, the question or the tool's answer
    assert trained == '<tool>get_weather{"city":"Oslo"}</tool><|im_end|>\nSunny.<|im_end|>\n'
    # parallel_tool_calls reaches the template too
    single = tokenize_example(_tool_example([_call("c1", "Oslo")], parallel_tool_calls=False), tooled,
                              max_seq_length=512)
    assert "(one call at a time)" in tooled.decode(single.input_ids)
    # a template that knows no tools renders without them
    unaware = copy.deepcopy(tokenizer)
    unaware.chat_template = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + "
                             "'<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}"
                             "{{ '<|im_start|>assistant\n' }}{% endif %}")
    plain = tokenize_example(_tool_example([_call("c1", "Oslo")]), unaware, max_seq_length=512)
    assert "get_weather" not in unaware.decode(plain.input_ids) and plain.num_loss_tokens


def test_parallel_tool_calls_false_refuses_a_turn_with_two_calls(tokenizer: Any) -> None:
    tooled = copy.deepcopy(tokenizer)
    tooled.chat_template = TOOL_TEMPLATE
    two = _tool_example([_call("c1", "Oslo"), _call("c2", "Rome")], parallel_tool_calls=False)
    with pytest.raises(BadDataError) as refused:
        tokenize_example(two, tooled, max_seq_length=512)
    assert refused.value.code == "invalid_tool_calls" and refused.value.param == "messages[1].tool_calls"
    assert tokenize_example({**two, "parallel_tool_calls": True}, tooled, max_seq_length=512).num_loss_tokens
