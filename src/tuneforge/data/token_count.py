"""Token counts of examples with the base model's real tokenizer and chat template.

Rendering a Jinja chat template costs tens of microseconds per example, which
alone would cap validation far below the rate a large dataset needs. So counts
are made in two passes:

1. *estimate*, in batch: every text field is tokenized on its own with the fast
   (Rust) tokenizer in one batched call, and the template's markup is added as
   a per-message constant measured once per role from the real template;
2. *exact*: examples whose estimate lands within `EXACT_MARGIN` of
   `max_seq_length` (or above it) are rendered through the real template and
   tokenized exactly, so every accept/truncate/reject decision is exact.

Stats and cost figures use the estimate for the rest; the estimate differs from
the exact count only where BPE merges cross a field boundary (a token or two).

Field lengths come from `PieceCounter` when the tokenizer allows it: for
byte-level BPE tokenizers (GPT-2, Llama 3, Qwen, Mistral-Nemo style — no
normalizer that changes text, a regex pre-tokenizer whose pieces hold a space
only as their first character or inside whitespace runs) a text's token count
is the sum of the counts of its space-separated words, each counted once and
then remembered. Real text repeats its words, so after the first batches
nearly every word is a dictionary hit: several times faster than tokenizing.
The equivalence is checked against the real tokenizer on the first texts of
every run; on any difference the counter falls back to the tokenizer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tuneforge.data.example import Example

EXACT_MARGIN = 0.9
_PROBE = "probe"


@dataclass(frozen=True)
class TemplateCosts:
    """Tokens the chat template adds: once per conversation, and per message by role."""

    base: int
    per_message: dict[str, int]
    generation_prompt: int


def _render_len(tokenizer: Any, messages: list[dict[str, Any]], add_generation_prompt: bool = False) -> int:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def measure_template(tokenizer: Any) -> TemplateCosts | None:
    """Template overheads, or None when the tokenizer has no chat template."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    probe_len = len(tokenizer(_PROBE, add_special_tokens=False)["input_ids"])
    user = [{"role": "user", "content": _PROBE}]
    one_user = _render_len(tokenizer, user)
    two_users = _render_len(tokenizer, user + user)
    per_user = two_users - one_user
    base = one_user - per_user
    per_message = {"user": per_user - probe_len}
    for role in ("system", "assistant", "tool", "developer"):
        try:
            with_role = _render_len(tokenizer, user + [{"role": role, "content": _PROBE, "tool_call_id": "x"}])
        except Exception:  # noqa: BLE001 - a template may refuse a role; it then costs like a user turn
            per_message[role] = per_message["user"]
            continue
        per_message[role] = with_role - one_user - probe_len
    generation = _render_len(tokenizer, user, add_generation_prompt=True) - one_user
    return TemplateCosts(base=max(0, base), per_message=per_message, generation_prompt=max(0, generation))


_WORD_BOUNDARY = re.compile(r" (?=\S)")  # a space before a non-space starts a new piece
_MAX_CACHED_WORDS = 1_000_000
_SELF_CHECK_TEXTS = 512


def _split_safe(backend: Any) -> bool:
    """Whether the tokenizer never merges across a space that starts a word."""
    try:
        config = json.loads(backend.to_str())
    except Exception:  # noqa: BLE001 - not a `tokenizers` tokenizer
        return False
    if (config.get("model") or {}).get("type") != "BPE" or config.get("normalizer") not in (None, {"type": "NFC"}):
        return False
    pre = config.get("pre_tokenizer") or {}
    if pre.get("type") == "ByteLevel":
        return bool(pre.get("use_regex", True)) and not pre.get("add_prefix_space", False)
    if pre.get("type") == "Sequence":
        parts = pre.get("pretokenizers") or []
        return (len(parts) == 2 and parts[0].get("type") == "Split" and parts[0].get("behavior") == "Isolated"
                and not parts[0].get("invert") and parts[1].get("type") == "ByteLevel"
                and not parts[1].get("use_regex", True) and not parts[1].get("add_prefix_space", False))
    return False


class PieceCounter:
    """Token counts of plain texts, as sums of remembered per-word counts.

    `lengths(texts)` equals `[len(tokenizer(t, add_special_tokens=False)) ...]`
    (checked on the first texts it sees; `active` turns False on a mismatch and
    every later call goes to the tokenizer). Words are split at a space
    followed by a non-space; the first word of a text is counted bare, every
    other one with its leading space, which is how the pre-tokenizer sees it.
    """

    def __init__(self, encode_batch: Any, backend: Any) -> None:
        self._encode_batch = encode_batch
        self.active = _split_safe(backend)
        self._nfc = self.active and json.loads(backend.to_str()).get("normalizer") is not None
        self._bare: dict[str, int] = {}
        self._spaced = _WordCounts()
        self._checked = 0

    def _tokenize(self, texts: list[str]) -> list[int]:
        return [len(encoding.ids) for encoding in self._encode_batch(texts, add_special_tokens=False)]

    def lengths(self, texts: list[str]) -> list[int]:
        if not self.active:
            return self._tokenize(texts)
        if self._nfc and not all(text.isascii() for text in texts):
            return self._tokenize(texts)
        counts = self._fast(texts)
        if self._checked < _SELF_CHECK_TEXTS:
            sample = texts[: _SELF_CHECK_TEXTS - self._checked]
            self._checked += len(sample)
            if self._tokenize(sample) != counts[: len(sample)]:
                self.active = False
                return self._tokenize(texts)
        return counts

    def _fast(self, texts: list[str]) -> list[int]:
        words = [text.split(" ") if "  " not in text and text.isprintable() else _WORD_BOUNDARY.split(text)
                 for text in texts]
        bare, spaced = self._bare, self._spaced
        if len(bare) + len(spaced) > _MAX_CACHED_WORDS:
            bare.clear()
            spaced.clear()
        # a word seen before is a dictionary hit; an unseen one counts 0 here and
        # is recorded with its text by __missing__, then all of them are
        # tokenized in one batch and added to the texts that hold them
        count = spaced.__getitem__
        totals: list[int] = []
        for index, parts in enumerate(words):
            spaced.current = index
            totals.append(sum(map(count, parts)))
        new_bare = {parts[0] for parts in words if parts[0] not in bare}
        if new_bare:
            bare.update(zip(new_bare, self._tokenize(list(new_bare))))
        if spaced.missing:
            misses, spaced.missing = spaced.missing, []
            unseen = list(dict.fromkeys(word for word, _ in misses))
            dict.update(spaced, zip(unseen, self._tokenize([" " + word for word in unseen])))
            for word, index in misses:
                totals[index] += spaced[word]
        return [total - count(parts[0]) + bare[parts[0]] for total, parts in zip(totals, words)]


class _WordCounts(dict):
    """Remembered counts; a lookup of an unknown word answers 0 and records
    (word, `current`), the index of the text being summed."""

    def __init__(self) -> None:
        super().__init__()
        self.missing: list[tuple[str, int]] = []
        self.current = 0

    def __missing__(self, word: str) -> int:
        self.missing.append((word, self.current))
        return 0


class TokenCounter:
    """Counts tokens of examples for one tokenizer, batch first, exact near the limit."""

    def __init__(self, tokenizer: Any, max_seq_length: int) -> None:
        self.tokenizer = tokenizer
        self.max_seq_length = int(max_seq_length)
        self.costs = measure_template(tokenizer)
        self._plain_overhead = len(tokenizer("", add_special_tokens=True)["input_ids"])
        # the Rust tokenizer's batch call skips transformers' per-call Python work (2-3x faster)
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._encode_batch = getattr(backend, "encode_batch_fast", None) or getattr(backend, "encode_batch", None)
        self._pieces = PieceCounter(self._encode_batch, backend) if self._encode_batch is not None else None

    def _lengths(self, pieces: list[str]) -> list[int]:
        if self._pieces is not None:
            return self._pieces.lengths(pieces)
        return [len(ids) for ids in self.tokenizer(pieces, add_special_tokens=False)["input_ids"]]

    def estimate(self, examples: Sequence[Example]) -> list[int]:
        """Estimated token count of each example (one batched tokenizer call)."""
        pieces: list[str] = []
        owners: list[int] = []
        constants = [0] * len(examples)
        for index, example in enumerate(examples):
            for text, extra in self._fields(example):
                pieces.append(text)
                owners.append(index)
                constants[index] += extra
        counts = list(constants)
        if pieces:
            for owner, length in zip(owners, self._lengths(pieces)):
                counts[owner] += length
        return counts

    def _fields(self, example: Example) -> list[tuple[str, int]]:
        """(text, markup tokens around it) for every field the model will see."""
        costs = self.costs
        if example.kind == "text" or costs is None or example.kind == "instruction":
            texts = example.texts()
            fields = [(t, 0) for t in texts]
            if fields:
                first_text, first_extra = fields[0]
                fields[0] = (first_text, first_extra + self._plain_overhead + 1)  # BOS + EOS
            return fields
        fields = [(_text(m), costs.per_message.get(m.get("role", "user"), costs.per_message["user"]))
                  for m in example.messages or []]
        for message in (example.chosen, example.rejected):
            if message is not None:
                fields.append((_text(message), costs.per_message["assistant"]))
        if fields:
            first_text, first_extra = fields[0]
            fields[0] = (first_text, first_extra + costs.base)
        return fields

    def exact(self, example: Example) -> int:
        """The exact count, through the real chat template."""
        if example.kind in ("chat", "prompt") and self.costs is not None:
            return _render_len(self.tokenizer, _plain_messages(example.messages or []))
        if (example.chosen is not None or example.rejected is not None) and self.costs is not None:
            prompt = _plain_messages(example.messages or [])
            longest = 0
            for message in (example.chosen, example.rejected):
                longest = max(longest, _render_len(self.tokenizer, prompt + _plain_messages([message or {}])))
            return longest
        text = "".join(example.texts())
        return len(self.tokenizer(text, add_special_tokens=True)["input_ids"]) + 1

    def count(self, examples: Sequence[Example]) -> tuple[list[int], list[bool]]:
        """Counts, and whether each one is exact (near or over the limit) or estimated."""
        counts = self.estimate(examples)
        exact_flags = [False] * len(counts)
        threshold = self.max_seq_length * EXACT_MARGIN
        for index, estimate in enumerate(counts):
            if estimate >= threshold:
                counts[index] = self.exact(examples[index])
                exact_flags[index] = True
        return counts, exact_flags


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    text = content or ""
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        text += f"{function.get('name', '')}{function.get('arguments', '')}"
    return text


def _plain_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as a chat template expects them (text content, no tuneforge keys)."""
    plain = []
    for message in messages:
        item = {"role": message.get("role", "user"), "content": _text({"content": message.get("content")})}
        if message.get("tool_calls"):
            item["tool_calls"] = message["tool_calls"]
        if message.get("tool_call_id"):
            item["tool_call_id"] = message["tool_call_id"]
        plain.append(item)
    return plain
