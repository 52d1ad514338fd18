"""Generation on one loaded model, token by token: the prompt rendered and
tokenized, a KV-cached decoding loop, sampling with a private random
generator, and the text handed out as it grows, cut at the first stop string.

The loop is written out rather than taken from `model.generate` because it
has to be a plain iterator: a stream yields each token as it is decided, a
stop string ends it, a client that went away cancels it between two tokens,
and a request's `seed` drives its own `torch.Generator` (the global RNG is
shared by every thread of the server).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from tuneforge.domain.errors import invalid
from tuneforge.serve.constrained import JsonConstraint
from tuneforge.serve.tools import plain_messages
from tuneforge.serve.params import Chunk, Prompt, SamplingParams, Usage

# A byte-level tokenizer decodes half a multi-byte character as U+FFFD; that
# text is held back until the next token completes the character.
_INCOMPLETE_CHARACTER = "\ufffd"


def prompt_token_ids(tokenizer: Any, prompt: Prompt, model_name: str) -> list[int]:
    """The prompt as the model reads it: chat messages through the tokenizer's chat
    template (with the assistant's turn opened), plain text with the tokenizer's own
    special tokens (a BOS where the model expects one)."""
    if prompt.token_ids is not None:
        vocab_size = len(tokenizer)
        bad = [token for token in prompt.token_ids if not 0 <= token < vocab_size]
        if bad:
            raise invalid(f"prompt holds token id {bad[0]}, outside the vocabulary of {model_name} "
                          f"(0-{vocab_size - 1})", param="prompt")
        return list(prompt.token_ids)
    if prompt.messages is None:
        return list(tokenizer(prompt.text or "")["input_ids"])
    if not getattr(tokenizer, "chat_template", None):
        raise invalid(f"{model_name} has no chat template; use /v1/completions with a prompt", param="model")
    from jinja2 import TemplateError

    messages, extra = list(prompt.messages), {}
    uses_tools = bool(prompt.tools) or any(m["role"] == "tool" or m.get("tool_calls") for m in messages)
    if uses_tools:
        if "tool" in str(tokenizer.chat_template):  # the template renders tools and calls its own way
            extra = {"tools": [dict(tool) for tool in prompt.tools]} if prompt.tools else {}
        else:
            messages = plain_messages(messages, prompt.tools)
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **extra)
    except TemplateError as exc:
        raise invalid(f"The chat template of {model_name} refused these messages: {exc}", param="messages") from exc
    # The rendered template already holds the special tokens (BOS, turn markers).
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def pick_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """The next token from one position's logits: argmax at temperature 0, otherwise a
    draw from the tempered distribution restricted to its top-p nucleus."""
    if params.temperature == 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)
    if params.top_p >= 1.0:
        return int(torch.multinomial(probs, 1, generator=generator))
    sorted_probs, order = torch.sort(probs, descending=True)
    # A token stays while the mass ranked above it is below top_p: the most likely one always does.
    keep = (torch.cumsum(sorted_probs, dim=-1) - sorted_probs) < params.top_p
    choice = torch.multinomial(sorted_probs * keep, 1, generator=generator)
    return int(order[choice])


def sample_tokens(model: Any, prompt_ids: Sequence[int], params: SamplingParams, *, device: torch.device,
                  eos_ids: frozenset[int], cancelled: threading.Event | None = None,
                  logits_to_keep: bool = False, scores: list | None = None,
                  constraint: JsonConstraint | None = None) -> Iterator[int]:
    """Token ids, one per forward pass over the new token (the KV cache holds the rest);
    ends after an EOS id, after `max_new_tokens`, or once `cancelled` is set. With `scores`
    and `params.logprobs`: before each id is yielded, (its log probability, [(rival id, log
    probability)] of the `params.logprobs` likeliest) is appended, from the model's own
    distribution (before temperature and top-p)."""
    generator = torch.Generator(device=device)
    if params.seed is None:
        generator.seed()
    else:
        generator.manual_seed(params.seed)
    # Only the last position's logits are needed: on a long prompt the full
    # [positions x vocabulary] matrix is most of the prefill's memory.
    extra = {"logits_to_keep": 1} if logits_to_keep else {}
    input_ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=device)
    cache = None
    for _ in range(params.max_new_tokens):
        if cancelled is not None and cancelled.is_set():
            return
        with torch.inference_mode():  # per step: grad mode is per thread, a generator may move
            output = model(input_ids=input_ids, past_key_values=cache, use_cache=True, **extra)
            cache = output.past_key_values
            if constraint is None:
                token_id = pick_token(output.logits[0, -1], params, generator)
            else:  # JSON mode: the likeliest token that keeps the output a JSON object; none: it is whole
                picked = constraint.pick(output.logits[0, -1], params, generator)
                if picked is None:
                    return
                token_id = picked
            if scores is not None and params.logprobs is not None:
                logprobs = torch.log_softmax(output.logits[0, -1].float(), dim=-1)
                top = torch.topk(logprobs, params.logprobs) if params.logprobs else None
                rivals = [] if top is None else [(int(i), float(v)) for v, i in zip(top.values, top.indices)]
                scores.append((float(logprobs[token_id]), rivals))
        yield token_id
        if token_id in eos_ids:
            return
        input_ids = torch.tensor([[token_id]], dtype=torch.long, device=device)


class TextAssembler:
    """Generated token ids -> the text that may be handed out so far.

    Text that could be the start of a stop string is held back until the next
    tokens show whether it is one; a stop string cuts the text where it begins
    and is never returned."""

    def __init__(self, tokenizer: Any, stop: Sequence[str]) -> None:
        self._tokenizer = tokenizer
        self._stop = tuple(s for s in stop if s)
        self._ids: list[int] = []
        self._text = ""
        self._released_chars = 0
        self.stopped = False

    @property
    def text(self) -> str:
        return self._text

    def push(self, token_id: int) -> str:
        """Add a token; returns the newly releasable text (often '')."""
        self._ids.append(token_id)
        # Decoding the whole sequence (not token by token) keeps the spacing
        # rules of tokenizers that merge a token with its neighbours.
        text = self._tokenizer.decode(self._ids, skip_special_tokens=True)
        cut = first_stop(text, self._stop)
        if cut is not None:
            self.stopped = True
            self._text = text[:cut]
            return self._release(cut)
        self._text = text
        if text.endswith(_INCOMPLETE_CHARACTER):
            return ""
        return self._release(len(text) - held_back_chars(text, self._stop))

    def flush(self) -> str:
        """Everything not yet released (the generation has ended)."""
        return self._release(len(self._text))

    def _release(self, upto_chars: int) -> str:
        piece = self._text[self._released_chars:upto_chars]
        self._released_chars = max(self._released_chars, upto_chars)
        return piece


def first_stop(text: str, stop: Sequence[str]) -> int | None:
    """Where the earliest stop string begins in `text`, or None."""
    found = [index for s in stop if (index := text.find(s)) >= 0]
    return min(found) if found else None


def held_back_chars(text: str, stop: Sequence[str]) -> int:
    """Length of the longest end of `text` that is the beginning of a stop string."""
    longest = 0
    for s in stop:
        for length in range(min(len(s) - 1, len(text)), longest, -1):
            if text.endswith(s[:length]):
                longest = length
                break
    return longest


def generate_chunks(model: Any, tokenizer: Any, prompt_ids: Sequence[int], params: SamplingParams, *,
                    device: torch.device, eos_ids: frozenset[int], cancelled: threading.Event | None = None,
                    logits_to_keep: bool = False) -> Iterator[Chunk]:
    """Text chunks as they are decided; the last chunk carries finish_reason and usage.

    finish_reason is "stop" after an EOS token or a stop string, "length" when
    `max_new_tokens` ran out first. Usage counts every token the model produced,
    an EOS included: each took a forward pass."""
    assembler = TextAssembler(tokenizer, params.stop)
    produced = 0
    finish_reason = "length"
    scores: list | None = [] if params.logprobs is not None else None
    pending: list[dict] = []  # log probabilities of tokens whose text is not out yet
    constraint = JsonConstraint(tokenizer, eos_ids) if params.json_mode else None
    tokens = sample_tokens(model, prompt_ids, params, device=device, eos_ids=eos_ids, cancelled=cancelled,
                           logits_to_keep=logits_to_keep, scores=scores, constraint=constraint)
    for token_id in tokens:
        produced += 1
        if token_id in eos_ids:
            finish_reason = "stop"
            break
        if scores:
            pending.append(token_logprob(tokenizer, token_id, *scores[-1]))
        piece = assembler.push(token_id)
        if piece:
            yield Chunk(piece, logprobs=tuple(pending))
            pending = []
        if assembler.stopped:
            finish_reason = "stop"
            break
    tokens.close()
    if constraint is not None and constraint.complete:
        finish_reason = "stop"  # the object is whole: nothing may follow it
    yield Chunk(assembler.flush(), finish_reason, Usage(len(prompt_ids), produced), logprobs=tuple(pending))


def token_logprob(tokenizer: Any, token_id: int, logprob: float, rivals: list[tuple[int, float]]) -> dict:
    """One token's entry in OpenAI's `logprobs.content` shape."""
    def shown(token: int, value: float) -> dict:
        text = tokenizer.decode([token])
        return {"token": text, "logprob": value, "bytes": list(text.encode("utf-8"))}

    return {**shown(token_id, logprob), "top_logprobs": [shown(token, value) for token, value in rivals]}
