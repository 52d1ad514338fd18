"""Turn one training example into `input_ids` and `labels` for a causal LM.

Two OpenAI formats are understood:

* chat: `{"messages": [{"role", "content", "weight"?}, ...]}`. The text is the
  base model's own chat template. Loss falls on assistant turns whose `weight`
  is 1 (the default; 0 turns them off), including the template's end-of-turn
  markup so the model learns to stop. With `train_on_inputs` every token
  carries loss.
* prompt/completion: `{"prompt": str, "completion": str}`. Prompt tokens (with
  whatever the tokenizer adds in front of plain text, e.g. BOS), then
  completion tokens and EOS; loss on the completion and EOS, or on everything
  with `train_on_inputs`.

Labels use `IGNORE_INDEX` (-100) where no loss is taken; the model shifts them
itself, so `labels[i]` is the target for the logits at position `i - 1`.

Truncation policy: an example longer than `max_seq_length` keeps its first
`max_seq_length` tokens (the beginning carries the system prompt and the
question). Loss tokens past the cut are dropped; an example whose loss tokens
are all cut contributes no loss and is counted by `TokenizedExample.num_loss_tokens`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tuneforge.data.errors import BadDataError

IGNORE_INDEX = -100
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass(frozen=True)
class TokenizedExample:
    input_ids: list[int]
    labels: list[int]

    @property
    def num_loss_tokens(self) -> int:
        return sum(label != IGNORE_INDEX for label in self.labels)


def tokenize_example(
    example: dict[str, Any],
    tokenizer: Any,
    *,
    max_seq_length: int,
    train_on_inputs: bool = False,
) -> TokenizedExample:
    """Tokenize a chat or prompt/completion example; raises `BadDataError` on a bad one."""
    if "messages" in example:
        return tokenize_chat(
            example["messages"], tokenizer, max_seq_length=max_seq_length,
            train_on_inputs=train_on_inputs, tools=example.get("tools"),
            parallel_tool_calls=example.get("parallel_tool_calls"),
        )
    if "prompt" in example and "completion" in example:
        return tokenize_prompt_completion(
            example["prompt"], example["completion"], tokenizer,
            max_seq_length=max_seq_length, train_on_inputs=train_on_inputs,
        )
    raise BadDataError(
        "invalid_example", "expected a 'messages' list or 'prompt' and 'completion' strings"
    )


def tokenize_prompt_completion(
    prompt: Any,
    completion: Any,
    tokenizer: Any,
    *,
    max_seq_length: int,
    train_on_inputs: bool = False,
) -> TokenizedExample:
    for name, value in (("prompt", prompt), ("completion", completion)):
        if not isinstance(value, str):
            raise BadDataError("invalid_example", f"'{name}' must be a string", param=name)
    prompt_ids = list(tokenizer(prompt, add_special_tokens=True)["input_ids"])
    eos_id = tokenizer.eos_token_id
    # A tokenizer that also appends EOS to plain text would end the prompt early.
    if eos_id is not None and prompt_ids and prompt_ids[-1] == eos_id:
        prompt_ids.pop()
    completion_ids = list(tokenizer(completion, add_special_tokens=False)["input_ids"])
    if eos_id is not None:
        completion_ids.append(eos_id)
    input_ids = prompt_ids + completion_ids
    prompt_labels = list(prompt_ids) if train_on_inputs else [IGNORE_INDEX] * len(prompt_ids)
    labels = prompt_labels + completion_ids
    return TokenizedExample(input_ids[:max_seq_length], labels[:max_seq_length])


def tokenize_chat(
    messages: Any,
    tokenizer: Any,
    *,
    max_seq_length: int,
    train_on_inputs: bool = False,
    tools: Any = None,
    parallel_tool_calls: Any = None,
) -> TokenizedExample:
    """`tools` (OpenAI function definitions) and `parallel_tool_calls` reach the chat template as
    `tools=` and `parallel_tool_calls=`, as at inference, so the model trains with the schemas
    it is shown when serving; a template without tool support renders without them."""
    turns, weights = _validated_turns(messages)
    template = template_arguments(tools, parallel_tool_calls)
    if parallel_tool_calls is False:
        for index, turn in enumerate(turns):
            if len(turn.get("tool_calls") or ()) > 1:
                raise BadDataError("invalid_tool_calls", f"messages[{index}] makes {len(turn['tool_calls'])} tool "
                                   "calls but parallel_tool_calls is false", param=f"messages[{index}].tool_calls")
    if not train_on_inputs and not any(
        turn["role"] == "assistant" and weight for turn, weight in zip(turns, weights)
    ):
        raise BadDataError(
            "no_trainable_messages", "every assistant message has weight 0", param="messages"
        )
    text, spans = assistant_char_spans(turns, weights, tokenizer, template)
    # The template wrote any BOS into the text; adding it again would double it.
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    input_ids = list(encoded["input_ids"])
    if train_on_inputs:
        labels = list(input_ids)
    else:
        in_loss = tokens_in_spans(encoded["offset_mapping"], spans)
        labels = [tid if keep else IGNORE_INDEX for tid, keep in zip(input_ids, in_loss)]
    return TokenizedExample(input_ids[:max_seq_length], labels[:max_seq_length])


def _validated_turns(messages: Any) -> tuple[list[dict[str, str]], list[int]]:
    """Plain `{role, content}` turns for the template, and each turn's weight."""
    if not isinstance(messages, list) or not messages:
        raise BadDataError("invalid_example", "'messages' must be a non-empty list", param="messages")
    turns, weights = [], []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise BadDataError("invalid_example", f"{where} must be an object", param=where)
        role = message.get("role")
        if role not in CHAT_ROLES:
            raise BadDataError(
                "invalid_role", f"{where}.role must be one of {', '.join(CHAT_ROLES)}",
                param=f"{where}.role",
            )
        turn: dict[str, Any] = {"role": role, "content": _content_text(message.get("content"), where)}
        # tool calls and results go to the template as they are; a template without tool
        # support refuses them with `chat_template_error`, naming the model's limit
        for key in ("tool_calls", "tool_call_id", "name"):
            if message.get(key):
                turn[key] = message[key]
        turns.append(turn)
        weight = message.get("weight", 1)
        if weight not in (0, 1) or isinstance(weight, bool):
            raise BadDataError("invalid_weight", f"{where}.weight must be 0 or 1", param=f"{where}.weight")
        if role != "assistant" and "weight" in message:
            raise BadDataError(
                "invalid_weight", f"{where}.weight is only allowed on assistant messages",
                param=f"{where}.weight",
            )
        weights.append(int(weight))
    if not any(turn["role"] == "assistant" for turn in turns):
        raise BadDataError("missing_assistant_message", "no assistant message", param="messages")
    return turns, weights


def _content_text(content: Any, where: str) -> str:
    """Message content as text: a string, or a list of OpenAI text parts (None: a tool-call-only turn)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
        for part in content
    ):
        return "".join(part["text"] for part in content)
    raise BadDataError(
        "invalid_content", f"{where}.content must be a string or a list of text parts",
        param=f"{where}.content",
    )


def template_arguments(tools: Any, parallel_tool_calls: Any) -> dict[str, Any]:
    """What a chat template gets beside the turns: `tools` and `parallel_tool_calls` when given."""
    arguments: dict[str, Any] = {}
    if tools:
        if not isinstance(tools, list) or not all(isinstance(tool, dict) for tool in tools):
            raise BadDataError("invalid_tools", "'tools' must be a list of tool definitions", param="tools")
        arguments["tools"] = tools
    if parallel_tool_calls is not None:
        if not isinstance(parallel_tool_calls, bool):
            raise BadDataError("invalid_type", "'parallel_tool_calls' must be true or false",
                               param="parallel_tool_calls")
        arguments["parallel_tool_calls"] = parallel_tool_calls
    return arguments


def _render(tokenizer: Any, turns: list[dict[str, str]], add_generation_prompt: bool,
            template: dict[str, Any] | None = None) -> str:
    try:
        return tokenizer.apply_chat_template(
            turns, tokenize=False, add_generation_prompt=add_generation_prompt, **(template or {})
        )
    except Exception as exc:  # noqa: BLE001 - jinja has its own types, templates raise on purpose
        raise BadDataError("chat_template_error", f"the model's chat template refused: {exc}") from None


def assistant_char_spans(
    turns: list[dict[str, str]], weights: list[int], tokenizer: Any, template: dict[str, Any] | None = None
) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character span of each trained assistant turn.

    A turn's span runs from the end of the conversation before it rendered
    with the generation prompt (exactly what the model sees at inference) to
    the end of the conversation through it. Templates that rewrite earlier
    turns break that prefix property; for those the turn's content is found
    in the text instead.
    """
    full_text = _render(tokenizer, turns, False, template)
    spans: list[tuple[int, int]] = []
    cursor = 0
    for index, turn in enumerate(turns):
        if turn["role"] != "assistant" or not weights[index]:
            cursor = _advance_past(full_text, turn["content"], cursor)
            continue
        span = _prefix_span(tokenizer, turns, index, full_text, template)
        if span is None:
            span = _search_span(tokenizer, turns, index, full_text, cursor, template)
        spans.append(span)
        cursor = span[1]
    return full_text, spans


def _prefix_span(
    tokenizer: Any, turns: list[dict[str, str]], index: int, full_text: str, template: dict[str, Any] | None
) -> tuple[int, int] | None:
    if index == 0:
        return None  # nothing precedes the turn, so there is no prompt to render
    before = _render(tokenizer, turns[:index], True, template)
    through = _render(tokenizer, turns[: index + 1], False, template)
    if through.startswith(before) and full_text.startswith(through) and len(through) > len(before):
        return len(before), len(through)
    return None


def _search_span(
    tokenizer: Any, turns: list[dict[str, str]], index: int, full_text: str, cursor: int,
    template: dict[str, Any] | None,
) -> tuple[int, int]:
    content = turns[index]["content"]
    start = full_text.find(content, cursor)
    if start < 0:
        raise BadDataError(
            "chat_template_error",
            f"cannot find messages[{index}] in the chat template's output",
            param=f"messages[{index}].content",
        )
    end = start + len(content)
    # Keep the end-of-turn markup so the model learns to stop: what the template
    # writes after this turn when it ends the conversation, else the EOS token.
    through = _render(tokenizer, turns[: index + 1], False, template)
    tail = through[through.rfind(content) + len(content):]
    eos = tokenizer.eos_token or ""
    if tail and full_text.startswith(tail, end):
        end += len(tail)
    elif eos and full_text.startswith(eos, end):
        end += len(eos)
    return start, end


def _advance_past(full_text: str, content: str, cursor: int) -> int:
    found = full_text.find(content, cursor) if content else -1
    return found + len(content) if found >= 0 else cursor


def tokens_in_spans(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> list[bool]:
    """For each token's (start, end) character offsets: does it overlap any span?

    Overlap rather than containment, so a token that straddles a span's edge
    (a merged space or newline) still carries loss.
    """
    flags = []
    for start, end in offsets:
        end = max(end, start + 1)  # a zero-width token still sits at `start`
        flags.append(any(start < span_end and end > span_start for span_start, span_end in spans))
    return flags
