"""Generation, token by token: the prompt rendered and tokenized, each next token
picked from the model's logits with the request's own random generator, and
the text handed out as it grows, cut at the first stop string.

The model runs elsewhere (`serve/batching.py` decodes many sequences in one
forward pass); a `SequenceDecoder` holds one request's state between steps.
It is written out rather than taken from `model.generate` because a stream
yields each token as it is decided, a stop string ends it, a client that went
away cancels it between two tokens, and a request's `seed` drives its own
`torch.Generator` (the global RNG is shared by every thread of the server).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from tuneforge.domain.errors import invalid
from tuneforge.domain.tenant_text import safe_text
from tuneforge.serve.constrained import JsonConstraint
from tuneforge.serve.params import Chunk, Prompt, SamplingParams, Usage
from tuneforge.serve.tools import plain_messages

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


class TextAssembler:
    """Generated token ids -> the text that may be handed out so far.

    Text that could be the start of a stop string is held back until the next
    tokens show whether it is one; a stop string cuts the text where it begins
    and is never returned.

    This is where the built-in engine turns tokens into text, so it is where a model's
    text is made safe (`domain/tenant_text.safe_text`): a byte-level tokenizer can emit
    NUL or any control character, which would otherwise reach answers, streams and
    whatever stores them. Stop strings are matched against the safe text, so they are
    made safe the same way."""

    def __init__(self, tokenizer: Any, stop: Sequence[str]) -> None:
        self._tokenizer = tokenizer
        self._stop = tuple(safe_text(s) for s in stop if s)
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
        # safe_text maps character by character, so released text stays a prefix of later text
        text = safe_text(self._tokenizer.decode(self._ids, skip_special_tokens=True))
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


def adjusted_logits(logits: torch.Tensor, params: SamplingParams, seen: torch.Tensor | None, produced: int,
                    eos_ids: frozenset[int]) -> torch.Tensor:
    """One position's logits after the sampling extensions, as vLLM applies them:
    `repetition_penalty` (a logit of a token already in the prompt or the output is divided by
    it when positive, multiplied when negative), `min_tokens` (no EOS before that many tokens)
    and `top_k` (only the k likeliest stay, when sampling)."""
    if params.repetition_penalty != 1.0 and seen is not None and seen.numel():
        logits = logits.clone()
        picked = logits[seen]
        logits[seen] = torch.where(picked > 0, picked / params.repetition_penalty, picked * params.repetition_penalty)
    if produced < params.min_tokens and eos_ids and not params.ignore_eos:
        logits = logits.clone()
        logits[list(eos_ids)] = float("-inf")
    if params.top_k > 0 and params.temperature > 0 and params.top_k < logits.shape[-1]:
        cutoff = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < cutoff, float("-inf"))
    return logits


class SequenceDecoder:
    """One request's generation, a token at a time: the model runs elsewhere (alone or in a
    batch) and hands this the logits of the sequence's last position; the decoder picks the
    next token with the request's own random generator and turns the tokens into text chunks.

    finish_reason is "stop" after an EOS token (unless `ignore_eos`), a stop string or a
    complete JSON object, "length" when `max_new_tokens` ran out first. Usage counts every
    token the model produced, an EOS included: each took a forward pass."""

    def __init__(self, tokenizer: Any, prompt_ids: Sequence[int], params: SamplingParams, *,
                 eos_ids: frozenset[int], device: torch.device) -> None:
        self.params = params
        self.eos_ids = eos_ids
        self.prompt_tokens = len(prompt_ids)
        self.produced = 0
        self.finish_reason: str | None = None
        self._tokenizer = tokenizer
        self._assembler = TextAssembler(tokenizer, params.stop)
        self._constraint = JsonConstraint(tokenizer, eos_ids) if params.json_mode else None
        self._pending: list[dict] = []  # log probabilities of tokens whose text is not out yet
        self._seen = (torch.tensor(sorted(set(prompt_ids)), dtype=torch.long, device=device)
                      if params.repetition_penalty != 1.0 else None)
        self.generator = torch.Generator(device=device)
        if params.seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(params.seed)

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def step(self, logits: torch.Tensor) -> tuple[int | None, list[Chunk]]:
        """The next token from the logits of the last position (None: the generation ended
        without one) and the chunks to hand out; the last chunk carries finish_reason and usage."""
        adjusted = adjusted_logits(logits, self.params, self._seen, self.produced, self.eos_ids)
        if self._constraint is None:
            token_id = pick_token(adjusted, self.params, self.generator)
        else:  # JSON mode: the likeliest token that keeps the output a JSON object; none: it is whole
            picked = self._constraint.pick(adjusted, self.params, self.generator)
            if picked is None:
                return None, [self._finish("stop" if self._constraint.complete else "length")]
            token_id = picked
        self.produced += 1
        if self._seen is not None:
            self._seen = torch.cat([self._seen, self._seen.new_tensor([token_id])])
        chunks: list[Chunk] = []
        if token_id in self.eos_ids and not self.params.ignore_eos:
            return token_id, [self._finish("stop")]
        if self.params.logprobs is not None:
            self._pending.append(self._score(logits, token_id))
        piece = self._assembler.push(token_id)
        if piece:
            chunks.append(Chunk(piece, logprobs=tuple(self._pending)))
            self._pending = []
        if self._assembler.stopped or (self._constraint is not None and self._constraint.complete):
            chunks.append(self._finish("stop"))  # a complete object: nothing may follow it
        elif self.produced >= self.params.max_new_tokens:
            chunks.append(self._finish("length"))
        return token_id, chunks

    def _finish(self, reason: str) -> Chunk:
        self.finish_reason = reason
        pending, self._pending = tuple(self._pending), []
        return Chunk(self._assembler.flush(), reason, Usage(self.prompt_tokens, self.produced), logprobs=pending)

    def _score(self, logits: torch.Tensor, token_id: int) -> dict:
        """The token's log probability and its likeliest rivals, from the model's own distribution
        (before temperature, top-p and the extensions)."""
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        rivals = []
        if self.params.logprobs:
            top = torch.topk(logprobs, self.params.logprobs)
            rivals = [(int(i), float(v)) for v, i in zip(top.values, top.indices)]
        return token_logprob(self._tokenizer, token_id, float(logprobs[token_id]), rivals)


def token_logprob(tokenizer: Any, token_id: int, logprob: float, rivals: list[tuple[int, float]]) -> dict:
    """One token's entry in OpenAI's `logprobs.content` shape."""
    def shown(token: int, value: float) -> dict:
        text = tokenizer.decode([token])
        # the token's text made safe to show; its bytes as the model produced them
        return {"token": safe_text(text), "logprob": value, "bytes": list(text.encode("utf-8", "surrogatepass"))}

    return {**shown(token_id, logprob), "top_logprobs": [shown(token, value) for token, value in rivals]}
