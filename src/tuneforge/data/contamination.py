"""Eval-set contamination: how much of a training example appears in a registered eval set.

Text is normalised the same way on both sides: lowercased, every punctuation
mark, symbol, space and control character (Unicode categories P*, S*, Z*,
C*) becomes a word break, words are what remains. An example's n-grams
(default 13 words, as in the GPT-3 contamination study) are looked up among
the n-grams of every registered eval set; the example is flagged when the
fraction of its n-gram occurrences found there reaches the threshold.

Short texts: an example with fewer than n words but at least
`min_short_words` (default 8) is compared whole — flagged (overlap 1.0) when
an eval item of fewer than n words has exactly its word sequence. Shorter
examples are skipped (a handful of words is not evidence), and a short
example that is a piece of a long eval item is not detected.

The index holds 64-bit hashes, not strings: a sorted array of n-gram hashes,
a bitmask per hash of the sources holding it (at most 64 sources), and a
bitmap of 16 bits per hash in front of it, so that a clean example — the
common case — costs one bitmap probe per n-gram. Hashes are computed with
numpy from the code points (never Python's per-process salted hash), so an
index is valid in any process.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from tuneforge.data.example import Finding
from tuneforge.data.minhash import mix64

MAX_SOURCES = 64
BATCH_ROWS = 2048
BATCH_CHARS = 1 << 20  # also bounds the power tables and the per-batch arrays
_U64 = np.uint64
_WORD_BASE = _U64(0x100000001B3)
_GRAM_BASE = _U64(0x9E3779B97F4A7C15)
_SHORT_DOMAIN = _U64(0x5BD1E9955BD1E995)  # whole-text hashes of short texts live apart from n-grams
_BITMAP_BITS_PER_HASH = 16
_SEP = "\x00"


@dataclass
class _Grams:
    """The n-gram hashes of a batch: hashes[i] belongs to row rows[i]; counts[r] is row r's total."""

    hashes: np.ndarray
    rows: np.ndarray
    counts: np.ndarray


class ContaminationIndex:
    """Word n-gram hashes of registered eval sets; `check` flags examples that overlap them."""

    def __init__(self, n: int = 13, min_short_words: int = 8) -> None:
        if n < 1 or not 1 <= min_short_words <= n:
            raise ValueError("need n >= 1 and 1 <= min_short_words <= n")
        self.n = n
        self.min_short_words = min_short_words
        self._sources: list[str] = []
        self._hashes = np.zeros(0, dtype=_U64)  # sorted, unique
        self._masks = np.zeros(0, dtype=_U64)  # bit i: source i holds the hash
        self._bitmap = np.zeros(1, dtype=np.uint8)
        self._bitmap_shift = _U64(63)

    @property
    def sources(self) -> list[str]:
        return list(self._sources)

    def __len__(self) -> int:
        return len(self._hashes)

    def add_source(self, name: str, texts: Iterable[str]) -> int:
        """Register an eval set; returns how many distinct n-grams (and short items) it added."""
        if name in self._sources:
            raise ValueError(f"source {name!r} is already registered")
        if len(self._sources) == MAX_SOURCES:
            raise ValueError(f"at most {MAX_SOURCES} sources")
        bit = _U64(1) << _U64(len(self._sources))
        parts = [np.unique(grams.hashes) for grams in self._grams_in_batches(texts)]
        new = np.unique(np.concatenate(parts)) if parts else np.zeros(0, dtype=_U64)
        self._sources.append(name)
        self._merge(new, bit)
        return len(new)

    def check(self, line: int, text: str, threshold: float = 0.5) -> Finding | None:
        """One text. Each call pays numpy's fixed cost (~0.2 ms here): for many
        texts use `check_batch`, ~15x faster per text."""
        findings = self.check_batch([line], [text], threshold)
        return findings[0] if findings else None

    def check_batch(self, lines: Sequence[int], texts: Sequence[str], threshold: float = 0.5) -> list[Finding]:
        """Findings for the texts whose overlap with one eval set or more reaches `threshold`."""
        if len(lines) != len(texts):
            raise ValueError("lines and texts differ in length")
        if not len(self._hashes):
            return []
        findings: list[Finding] = []
        for start, end in _batches(texts):
            findings += self._flag(self._grams(list(texts[start:end])), list(lines[start:end]), threshold)
        return findings

    def _flag(self, grams: _Grams, lines: list[int], threshold: float) -> list[Finding]:
        masks = self._lookup(grams.hashes)
        hit = masks != 0
        hits_per_row = np.bincount(grams.rows[hit], minlength=len(lines))
        overlap = hits_per_row / np.maximum(grams.counts, 1)
        flagged = np.flatnonzero((hits_per_row > 0) & (overlap >= threshold))
        findings = []
        for row in flagged:
            row_masks = masks[hit & (grams.rows == row)]
            per_source = [int(np.count_nonzero(row_masks & (_U64(1) << _U64(i)))) for i in range(len(self._sources))]
            source = self._sources[int(np.argmax(per_source))]  # ties: the first registered
            findings.append(Finding(line=lines[row], kind="contamination",
                                    detail={"overlap": round(float(overlap[row]), 4), "source": source}))
        return findings

    def _lookup(self, hashes: np.ndarray) -> np.ndarray:
        """Each hash's source mask (0 when no source holds it); the bitmap answers most misses."""
        bits = (hashes >> self._bitmap_shift).astype(np.intp)
        maybe = np.flatnonzero((self._bitmap[bits >> 3] >> (bits & 7).astype(np.uint8)) & 1)
        masks = np.zeros(len(hashes), dtype=_U64)
        if maybe.size:
            at = np.minimum(np.searchsorted(self._hashes, hashes[maybe]), len(self._hashes) - 1)
            present = self._hashes[at] == hashes[maybe]
            masks[maybe[present]] = self._masks[at[present]]
        return masks

    def _merge(self, new: np.ndarray, bit: np.uint64) -> None:
        hashes = np.concatenate([self._hashes, new])
        masks = np.concatenate([self._masks, np.full(len(new), bit, dtype=_U64)])
        order = np.argsort(hashes, kind="stable")
        hashes, masks = hashes[order], masks[order]
        starts = np.flatnonzero(np.r_[True, hashes[1:] != hashes[:-1]]) if len(hashes) else np.zeros(0, int)
        self._hashes = hashes[starts]
        self._masks = np.bitwise_or.reduceat(masks, starts) if len(starts) else masks
        bitmap_bits = max(1 << 16, 1 << int(np.ceil(np.log2(max(len(self._hashes), 1) * _BITMAP_BITS_PER_HASH))))
        self._bitmap_shift = _U64(64 - bitmap_bits.bit_length() + 1)
        self._bitmap = np.zeros(bitmap_bits // 8, dtype=np.uint8)
        positions = (self._hashes >> self._bitmap_shift).astype(np.intp)
        np.bitwise_or.at(self._bitmap, positions >> 3, (1 << (positions & 7)).astype(np.uint8))

    def _grams_in_batches(self, texts: Iterable[str]) -> Iterable[_Grams]:
        batch: list[str] = []
        chars = 0
        for text in texts:
            batch.append(text)
            chars += len(text)
            if len(batch) == BATCH_ROWS or chars >= BATCH_CHARS:
                yield self._grams(batch)
                batch, chars = [], 0
        if batch:
            yield self._grams(batch)

    def _grams(self, texts: list[str]) -> _Grams:
        words, word_rows = word_hashes(texts)
        return _word_ngrams(words, word_rows, len(texts), self.n, self.min_short_words)


def _batches(texts: Sequence[str]) -> Iterable[tuple[int, int]]:
    """[start, end) ranges of at most BATCH_ROWS texts and about BATCH_CHARS characters."""
    start = chars = 0
    for i, text in enumerate(texts):
        chars += len(text)
        if i + 1 - start == BATCH_ROWS or chars >= BATCH_CHARS:
            yield start, i + 1
            start, chars = i + 1, 0
    if start < len(texts):
        yield start, len(texts)


def word_hashes(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """64-bit hashes of the normalised words of every text, in order, and each word's text index."""
    joined = _SEP.join(text.replace(_SEP, " ") for text in texts).lower() + _SEP
    units = _code_units(joined)
    units = _LATIN1_WORD_UNITS()[units] if units.dtype == np.uint8 else np.where(_word_breaks()[units], 32, units)
    in_word = (units != 32) & (units != 0)
    after_word = np.zeros(len(units), dtype=bool)
    after_word[1:] = in_word[:-1]
    starts = np.flatnonzero(in_word & ~after_word)
    ends = np.flatnonzero(after_word & ~in_word)  # the text ends with NUL, so every word ends
    # polynomial hash of each word from prefix sums: sum(c_t * B^t) over the word, times B^-start
    powers, inverse = _powers(_WORD_BASE, len(units))
    prefix = np.zeros(len(units) + 1, dtype=_U64)
    np.cumsum(units.astype(_U64) * powers, dtype=_U64, out=prefix[1:])  # word characters are never 0
    words = mix64((prefix[ends] - prefix[starts]) * inverse[starts] ^ (ends - starts).astype(_U64))
    text_starts = np.concatenate([[0], np.flatnonzero(units == 0)[:-1] + 1])
    words_per_text = np.add.reduceat(in_word & ~after_word, text_starts, dtype=np.int64)
    return words, np.repeat(np.arange(len(texts)), words_per_text)


def _word_ngrams(words: np.ndarray, word_rows: np.ndarray, rows: int, n: int, min_short: int) -> _Grams:
    """n-gram hashes (prefix sums again, over word hashes) plus whole-text hashes of short rows."""
    per_row = np.bincount(word_rows, minlength=rows)
    first_word = np.concatenate([[0], np.cumsum(per_row)[:-1]])
    powers, inverse = _powers(_GRAM_BASE, len(words))
    prefix = np.zeros(len(words) + 1, dtype=_U64)
    np.cumsum(words * powers, dtype=_U64, out=prefix[1:])
    gram_counts = np.maximum(per_row - n + 1, 0)
    starts = np.repeat(first_word, gram_counts) + _ranks(gram_counts)
    hashes = mix64((prefix[starts + n] - prefix[starts]) * inverse[starts])
    short = np.flatnonzero((per_row >= min_short) & (per_row < n))
    first, last = first_word[short], first_word[short] + per_row[short]
    whole = mix64((prefix[last] - prefix[first]) * inverse[first] ^ _SHORT_DOMAIN ^ per_row[short].astype(_U64))
    counts = gram_counts.copy()
    counts[short] = 1
    return _Grams(hashes=np.concatenate([hashes, whole]),
                  rows=np.concatenate([np.repeat(np.arange(rows), gram_counts), short]),
                  counts=counts)


def _ranks(counts: np.ndarray) -> np.ndarray:
    """0..count-1 for each count, concatenated."""
    total = int(counts.sum())
    return np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)


def _code_units(text: str) -> np.ndarray:
    try:
        return np.frombuffer(text.encode("latin-1"), dtype=np.uint8)
    except UnicodeEncodeError:
        return np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)


def _powers(base: np.uint64, count: int) -> tuple[np.ndarray, np.ndarray]:
    """base**t and base**-t modulo 2**64 for t in [0, count) (base is odd, so it
    has an inverse): views of tables kept per base, grown by doubling."""
    up, down = _POWER_TABLES.get(int(base), (np.ones(0, dtype=_U64), np.ones(0, dtype=_U64)))
    if len(up) < count:
        size = max(count, 2 * len(up), 1 << 16)
        inverse = _U64(pow(int(base), -1, 1 << 64))
        up, down = np.ones(size, dtype=_U64), np.ones(size, dtype=_U64)
        up[1:] = np.cumprod(np.full(size - 1, base, dtype=_U64))
        down[1:] = np.cumprod(np.full(size - 1, inverse, dtype=_U64))
        _POWER_TABLES[int(base)] = (up, down)
    return up[:count], down[:count]


_POWER_TABLES: dict[int, tuple[np.ndarray, np.ndarray]] = {}


@lru_cache(maxsize=1)
def _word_breaks() -> np.ndarray:
    """Per code point: True for what separates words (punctuation, symbols, spaces,
    controls). Built once per process (~0.3 s)."""
    breaks = np.zeros(0x110000, dtype=bool)
    for code in range(0x110000):
        if unicodedata.category(chr(code))[0] in "PSZC":
            breaks[code] = True
    breaks[0] = False  # NUL separates texts, not words
    return breaks


@lru_cache(maxsize=1)
def _LATIN1_WORD_UNITS() -> np.ndarray:  # noqa: N802 - a constant built on first use
    """Latin-1 code unit → itself, or 32 (space) for a word break: one gather per character."""
    return np.where(_word_breaks()[:256], 32, np.arange(256)).astype(np.uint8)
