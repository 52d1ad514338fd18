"""Token counts: the word-cache fast path equals the real tokenizer, and falls back when it cannot."""

from __future__ import annotations

import random
from typing import Any

import pytest
from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from tuneforge.data.example import Example
from tuneforge.data.token_count import PieceCounter, TokenCounter
from tuneforge.demo.tiny_model import build_corpus

LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")

TRICKY = [
    "", " ", "  ", "a", " a", "a ", "a  b", "a   b", "a\nb", "a\n b", "a \nb", "a\n\n  b", "x\t y", "end.\n",
    "Hello, world! It's 2026: 12345 tokens?", "  leading and trailing  ", "wow!!!\nnext", "tab\tsep\tvalues",
    "naïve café — ünïcödé ✓ 漢字 テスト", "emoji 🙂 🙂🙂", "code: def f(x):\n    return x ** 2\n", "a\u00a0b\u2003c",
    "dots... and -- dashes", "'s 're don't", "1 22 333 4444 55555", "\r\n windows\r\n", "x" * 300,
]


def _random_texts(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    alphabet = list("abcdefgh ijk lmn  op\n\t.,!?'0123456789é漢🙂-") + ["the ", "model ", "  ", "\n\n"]
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 80))) for _ in range(count)]


def _wrap(tokenizer: Tokenizer) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer)


def _trained(pre_tokenizer: Any, normalizer: Any = None) -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizer
    if normalizer is not None:
        tokenizer.normalizer = normalizer
    trainer = trainers.BpeTrainer(vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(build_corpus(), trainer=trainer)
    return _wrap(tokenizer)


def _real(tokenizer: PreTrainedTokenizerFast, texts: list[str]) -> list[int]:
    return [len(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in texts]


def _counter(tokenizer: PreTrainedTokenizerFast) -> PieceCounter:
    backend = tokenizer.backend_tokenizer
    return PieceCounter(backend.encode_batch, backend)


@pytest.fixture(scope="module")
def llama3_style() -> PreTrainedTokenizerFast:
    return _trained(pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]))


def test_fast_path_equals_tokenizer_gpt2_style(tokenizer: Any) -> None:
    counter = _counter(tokenizer)
    assert counter.active
    texts = TRICKY + _random_texts(3000)
    # past the self-check, so the cached sums themselves are compared
    counter.lengths(texts[:600])
    assert counter.lengths(texts) == _real(tokenizer, texts)
    assert counter.active


def test_fast_path_equals_tokenizer_llama3_style(llama3_style: PreTrainedTokenizerFast) -> None:
    counter = _counter(llama3_style)
    assert counter.active
    texts = TRICKY + _random_texts(3000, seed=1)
    counter.lengths(texts[:600])
    assert counter.lengths(texts) == _real(llama3_style, texts)


def test_unsafe_tokenizers_never_take_the_fast_path() -> None:
    # a prefix space changes how every first word is tokenized; a lowercasing normalizer changes the text
    prefixed = _trained(pre_tokenizers.ByteLevel(add_prefix_space=True))
    lowered = _trained(pre_tokenizers.ByteLevel(add_prefix_space=False), normalizers.Lowercase())
    whitespace = _trained(pre_tokenizers.Whitespace())
    for tokenizer in (prefixed, lowered, whitespace):
        counter = _counter(tokenizer)
        assert not counter.active
        assert counter.lengths(TRICKY) == _real(tokenizer, TRICKY)


def test_self_check_switches_off_on_a_mismatch(tokenizer: Any) -> None:
    counter = _counter(tokenizer)
    counter._spaced["poisoned"] = 99  # a wrong remembered count, as a tokenizer outside the rules would give
    texts = ["a poisoned word"] * 3
    assert counter.lengths(texts) == _real(tokenizer, texts)
    assert not counter.active


def test_counts_of_examples_match_the_chat_template(tokenizer: Any) -> None:
    counter = TokenCounter(tokenizer, max_seq_length=4096)
    examples = [Example(line=i + 1, kind="chat", messages=[
        {"role": "system", "content": "You answer briefly."},
        {"role": "user", "content": text or "?"},
        {"role": "assistant", "content": f"answer {i}  with  spaces\nand lines"}]) for i, text in enumerate(TRICKY)]
    estimates = counter.estimate(examples)
    exact = [counter.exact(example) for example in examples]
    # the estimate may differ from the rendered template only where BPE merges cross a field boundary
    assert all(abs(a - b) <= 2 for a, b in zip(estimates, exact)), list(zip(estimates, exact))
    assert sum(estimates) == pytest.approx(sum(exact), rel=0.01)
