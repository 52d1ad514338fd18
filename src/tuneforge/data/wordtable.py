"""Remembered per-word token counts looked up a whole batch at a time in numpy.

`token_count.PieceCounter` counts a text as the sum of its space-separated
words' counts. Looking each word up in a dict costs a Python string per word
(~100 words a chat example); here the words of a batch are never made into
strings. The batch's text is one UTF-8 buffer, words are the runs between
single spaces, and a word of at most 16 bytes is its own key: its bytes,
zero-padded, in two uint64 (printable text holds no NUL byte, so the key is
the word, not a hash of it). A direct-mapped table of keys and counts answers
every word with a few gathers; a word whose slot holds another key, a word
longer than 16 bytes, or one never seen is a miss, and only misses are turned
into strings and counted by the caller (then stored, if their slot is free).

Bounded: the table has a fixed number of slots and is emptied when half of
them are taken, so one-off words (numbers, ids) cannot fill it for good.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

_U64 = np.uint64
MAX_KEY_BYTES = 16
_LOW_MASKS = np.array([(1 << (8 * k)) - 1 for k in range(9)], dtype=np.uint64)  # the first k bytes of a uint64
_SPACE = 0x20
_MIX = (_U64(0x9E3779B97F4A7C15), _U64(0xC2B2AE3D27D4EB4F), _U64(0x165667B19E3779F9))


class WordTable:
    """Token counts of words (as the caller counts them), keyed by the words' own bytes."""

    def __init__(self, slot_bits: int = 19) -> None:
        self._bits = slot_bits
        size = 1 << slot_bits
        self._low = np.zeros(size, dtype=np.uint64)
        self._high = np.zeros(size, dtype=np.uint64)
        self._counts = np.full(size, -1, dtype=np.int64)  # -1: a free slot
        self._used = 0

    def __len__(self) -> int:
        return self._used

    def clear(self) -> None:
        self._counts.fill(-1)
        self._used = 0

    def counts(self, data: bytes, count_missing: Callable[[list[str]], list[int]]) -> np.ndarray:
        """The count of every word of `data` (UTF-8, words separated by single
        spaces, so `len(result) == data.count(b" ") + 1`), in order.
        `count_missing(words)` counts the words the table cannot answer."""
        units = np.frombuffer(data, dtype=np.uint8)
        spaces = np.flatnonzero(units == _SPACE)
        starts = np.empty(len(spaces) + 1, dtype=np.int64)
        starts[0] = 0
        starts[1:] = spaces + 1
        ends = np.empty_like(starts)
        ends[:-1] = spaces
        ends[-1] = len(units)
        lengths = ends - starts
        low, high = _keys(units, starts, lengths)
        slots = self._slots(low, high)
        counts = self._counts[slots]
        hit = (counts >= 0) & (self._low[slots] == low) & (self._high[slots] == high) & (lengths <= MAX_KEY_BYTES)
        missing = np.flatnonzero(~hit)
        if missing.size:
            counts[missing] = self._fill(data, missing, starts, ends, lengths, low, high, slots, count_missing)
        return counts

    def _fill(self, data: bytes, missing: np.ndarray, starts: np.ndarray, ends: np.ndarray, lengths: np.ndarray,
              low: np.ndarray, high: np.ndarray, slots: np.ndarray,
              count_missing: Callable[[list[str]], list[int]]) -> np.ndarray:
        """Counts of the missed words; those that fit a free slot are stored."""
        words = [data[start:end].decode("utf-8") for start, end in zip(starts[missing].tolist(),
                                                                        ends[missing].tolist())]
        unique = list(dict.fromkeys(words))
        by_word = dict(zip(unique, count_missing(unique)))
        found = np.fromiter((by_word[word] for word in words), dtype=np.int64, count=len(words))
        if self._used * 2 > len(self._counts):
            self.clear()
        storable = (lengths[missing] <= MAX_KEY_BYTES) & (self._counts[slots[missing]] < 0)
        if storable.any():
            chosen = missing[storable]
            free, first = np.unique(slots[chosen], return_index=True)  # one word per free slot
            source = chosen[first]
            self._low[free] = low[source]
            self._high[free] = high[source]
            self._counts[free] = found[np.flatnonzero(storable)[first]]
            self._used += len(free)
        return found

    def _slots(self, low: np.ndarray, high: np.ndarray) -> np.ndarray:
        mixed = low * _MIX[0] ^ high * _MIX[1]
        mixed ^= mixed >> _U64(29)
        return ((mixed * _MIX[2]) >> _U64(64 - self._bits)).astype(np.int64)


def _keys(units: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each word's first 16 bytes, zero-padded, as two little-endian uint64."""
    padded = np.zeros(len(units) + 2 * 8 + 8, dtype=np.uint8)
    padded[: len(units)] = units
    windows = np.ndarray(shape=(len(units) + 16,), dtype="<u8", buffer=padded.data, strides=(1,))
    low = windows[starts] & _LOW_MASKS[np.minimum(lengths, 8)]
    high = windows[starts + 8] & _LOW_MASKS[np.clip(lengths - 8, 0, 8)]
    return low, high
