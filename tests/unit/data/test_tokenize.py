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
