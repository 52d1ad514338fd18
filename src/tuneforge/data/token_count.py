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
nearly every word is a hit in a table looked up a whole batch at a time
(`data.wordtable`); a new word is counted from its pre-tokens where the
pre-tokenizer is GPT-2's, else by the tokenizer.
The equivalence is checked against the real tokenizer on the first texts of
every run; on any difference the counter falls back to the tokenizer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain, repeat
from typing import Any

import numpy as np

from tuneforge.data.example import Example
from tuneforge.data.wordtable import WordTable

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

    A batch of plain texts (printable, no double space) is looked up whole in
    a `WordTable`, without a Python string per word; other batches are split
    per text and looked up in a dict. The sums per text come from
    `numpy.add.reduceat`. A word seen for the first time is counted from its
    pre-tokens when `_PreTokens` can split it exactly (byte-level BPE,
    printable ASCII): a new "12345)?" then costs a regex split, a hit for ")?"
    and one BPE call for " 12345", not a whole tokenizer call. Anything else
    goes to the tokenizer, in one batch.
    """

    def __init__(self, encode_batch: Any, backend: Any) -> None:
        self._encode_batch = encode_batch
        self.active = _split_safe(backend)
        self._nfc = self.active and json.loads(backend.to_str()).get("normalizer") is not None
        self._pre = _PreTokens.for_backend(backend) if self.active else None
        self._bare: dict[str, int] = {}
        self._spaced: dict[str, int] = {}
        self._table = WordTable()  # the counts of `_spaced`'s short words, for whole-batch lookups
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
        if not texts:
            return []
        bare, spaced = self._bare, self._spaced
        if len(bare) + len(spaced) + (self._pre.size if self._pre is not None else 0) > _MAX_CACHED_WORDS:
            bare.clear()
            spaced.clear()
            if self._pre is not None:
                self._pre.clear()
        joined = " ".join(texts)
        # every text plain (printable, no double space; a double space where two texts meet is fine):
        # the words of all of them are the words of `joined`, looked up without making strings
        if joined.isprintable() and ("  " not in joined or not any("  " in text for text in texts)):
            sizes = [text.count(" ") + 1 for text in texts]
            starts = _starts(sizes)
            firsts = [text.partition(" ")[0] for text in texts]
            values = self._table.counts(joined.encode("utf-8"), self._count_spaced)
        else:
            words, sizes = _split_words(texts)
            starts = _starts(sizes)
            firsts = [words[start] for start in starts.tolist()]
            values = self._lookup(spaced, words, " ")
        first_values = self._lookup(bare, firsts, "")
        totals = np.add.reduceat(values, starts) - values[starts] + first_values
        return totals.tolist()

    def _count_spaced(self, words: list[str]) -> list[int]:
        return self._lookup(self._spaced, words, " ").tolist()

    def _lookup(self, counts: dict[str, int], words: list[str], prefix: str) -> np.ndarray:
        """Remembered counts of `prefix + word` for every word; unseen words are counted and remembered."""
        values = np.fromiter(map(counts.get, words, repeat(-1)), dtype=np.int64, count=len(words))
        missing = np.flatnonzero(values < 0).tolist()
        if missing:
            unseen = list(dict.fromkeys(words[index] for index in missing))
            slow: list[str] = []
            for word in unseen:
                if self._pre is not None and self._pre.usable(prefix + word):
                    counts[word] = self._pre.count(prefix + word)
                else:
                    slow.append(word)
            if slow:
                counts.update(zip(slow, self._tokenize([prefix + word for word in slow])))
            values[missing] = [counts[words[index]] for index in missing]
        return values


def _starts(sizes: list[int]) -> np.ndarray:
    """Where each text's words start in the batch's list of words."""
    ends = np.cumsum(np.asarray(sizes, dtype=np.int64))
    return ends - np.asarray(sizes, dtype=np.int64)


def _split_words(texts: list[str]) -> tuple[list[str], list[int]]:
    """Every text's words, concatenated, and how many each text has."""
    parts = [text.split(" ") if "  " not in text and text.isprintable() else _WORD_BOUNDARY.split(text)
             for text in texts]
    return list(chain.from_iterable(parts)), [len(words) for words in parts]


# GPT-2's pre-tokenizer pattern (ByteLevel with use_regex) for printable ASCII,
# where \p{L} is [A-Za-z], \p{N} is [0-9] and the only whitespace is the space
_ASCII_BYTE_LEVEL = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+")


class _PreTokens:
    """Counts of single pre-tokens of a ByteLevel(use_regex) BPE tokenizer,
    remembered. A printable ASCII text's pre-tokens are what `_ASCII_BYTE_LEVEL`
    finds, byte-level mapping leaves every printable ASCII character as it is
    but the space (which becomes "\u0120"), and BPE runs on each pre-token
    alone: so a text's count is the sum of its pre-tokens' BPE lengths. Texts
    holding an added (special) token's text are not `usable`: the tokenizer
    splits those out before pre-tokenizing."""

    def __init__(self, model_tokenize: Any, added: list[str]) -> None:
        self._model_tokenize = model_tokenize
        self._added = re.compile("|".join(map(re.escape, added))) if added else None
        self._counts: dict[str, int] = {}

    @classmethod
    def for_backend(cls, backend: Any) -> _PreTokens | None:
        try:
            config = json.loads(backend.to_str())
            added = [token.content for token in backend.get_added_tokens_decoder().values()]
            model_tokenize = backend.model.tokenize
        except Exception:  # noqa: BLE001 - not a `tokenizers` tokenizer of the usual build
            return None
        pre = config.get("pre_tokenizer") or {}
        if pre.get("type") != "ByteLevel" or not pre.get("use_regex", True) or pre.get("add_prefix_space"):
            return None
        return cls(model_tokenize, added)

    @property
    def size(self) -> int:
        return len(self._counts)

    def clear(self) -> None:
        self._counts.clear()

    def usable(self, text: str) -> bool:
        return text.isascii() and text.isprintable() and (self._added is None or self._added.search(text) is None)

    def count(self, text: str) -> int:
        counts = self._counts
        total = 0
        for piece in _ASCII_BYTE_LEVEL.findall(text):
            length = counts.get(piece)
            if length is None:
                length = counts[piece] = len(self._model_tokenize(piece.replace(" ", "\u0120")))
            total += length
        return total


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
        """Estimated token count of each example (one batched count of every field)."""
        pieces: list[str] = []
        sizes: list[int] = []
        constants: list[int] = []
        for example in examples:
            texts, extra = self._fields(example)
            pieces += texts
            sizes.append(len(texts))
            constants.append(extra)
        if not pieces:
            return constants
        owners = np.repeat(np.arange(len(examples)), sizes)
        lengths = np.asarray(self._lengths(pieces), dtype=np.int64)
        sums = np.zeros(len(examples), dtype=np.int64)
        np.add.at(sums, owners, lengths)
        return (sums + np.asarray(constants, dtype=np.int64)).tolist()

    def _fields(self, example: Example) -> tuple[list[str], int]:
        """The text of every field the model will see, and the markup tokens around them all."""
        costs = self.costs
        if example.kind == "text" or costs is None or example.kind == "instruction":
            texts = example.texts()
            return texts, (self._plain_overhead + 1 if texts else 0)  # BOS + EOS
        per_message, user = costs.per_message, costs.per_message["user"]
        texts = []
        extra = 0
        for message in example.messages or []:
            content = message.get("content")
            # a plain {role, content} turn (nearly all of them) is its content
            texts.append(content if len(message) == 2 and type(content) is str else _text(message))
            extra += per_message.get(message.get("role", "user"), user)
        for message in (example.chosen, example.rejected):
            if message is not None:
                texts.append(_text(message))
                extra += per_message["assistant"]
        return texts, (extra + costs.base if texts else 0)

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
