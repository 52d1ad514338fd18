"""A vectorised hash table from 32-bit key tags to row ids.

Dedup makes a dozen lookups per row; a Python dict of ints costs ~100 bytes an
entry and one interpreter round trip per key. This table costs 8 bytes a slot
and answers a whole batch with a handful of numpy calls.

`lookup_or_insert` is the one operation: the probe that finds a key missing
also finds the free slot where it belongs. "First insert wins": a key keeps
the smallest value it was offered in the call that inserted it, and later
calls get that value back — what first-occurrence dedup wants when values are
row ids.

Only the high 32 bits of a key are kept (its tag; tag 0 marks a free slot, so
keys whose tag would be 0 use 1). Two keys with one tag are one key to this
table: callers verify what it answers (near dedup verifies every candidate,
exact dedup compares the full key).

Layout: two-choice hashing over buckets of 4 slots. Each tag has two home
buckets; it is in one of them, or — if both were full when it came — in the
first bucket after the second home with a free slot. Tags and values live in
separate uint32 arrays, so a lookup gathers 32 bytes of tags per key. At the
default 80% load both homes are rarely full; those keys, and the last few of a
batch, are finished in plain Python.
"""

from __future__ import annotations

import numpy as np

_U64 = np.uint64
_U32 = np.uint32
_ENCODE = 0xFFFFFFFF  # values are stored as 0xFFFFFFFF - value, so max() keeps the smallest
_HOME_MULTIPLIERS = (_U64(0x9E3779B97F4A7C15), _U64(0xC2B2AE3D27D4EB4F))
_BUCKET = 4
_MIN_HOME_BUCKETS = 1 << 10
_OVERFLOW_BUCKETS = 1 << 10  # spare buckets past the last home bucket, for the rare chains
_SCALAR_TAIL = 32  # a batch's last keys are finished one by one
_GROW_SLICE_BUCKETS = 1 << 16  # buckets moved together when the table doubles
MAX_VALUE = 0xFFFFFFFE


class KeyTable:
    """uint64 keys (their high 32 bits) → values in [0, MAX_VALUE], first insert wins."""

    def __init__(self, max_load: float = 0.8) -> None:
        if not 0.1 <= max_load <= 0.9:
            raise ValueError("max_load must be within [0.1, 0.9]")
        self._max_load = max_load
        self._allocate(_MIN_HOME_BUCKETS)

    def __len__(self) -> int:
        return self._count

    @property
    def nbytes(self) -> int:
        return self._tags.nbytes + self._values.nbytes

    def lookup_or_insert(self, keys: np.ndarray, values: np.ndarray) -> np.ndarray:
        """For each key, the value it held before this call — or, when absent,
        -1 for the occurrence that inserted it and the inserted value for its
        repeats in this call."""
        tags = (np.asarray(keys).astype(_U64, copy=False) >> _U64(32)).astype(_U32)
        tags[tags == 0] = 1
        values = np.asarray(values, dtype=np.int64)
        if len(values) and (values.min() < 0 or values.max() > MAX_VALUE):
            raise ValueError(f"values must be within [0, {MAX_VALUE}]")
        if self._count + len(tags) > self._max_load * self._home_buckets * _BUCKET:
            self._grow(self._count + len(tags))
        return self._probe(tags, (_ENCODE - values).astype(_U32))

    def _probe(self, tags: np.ndarray, encoded: np.ndarray) -> np.ndarray:
        found = np.full(len(tags), -1, dtype=np.int64)
        pending = np.arange(len(tags))
        while pending.size > _SCALAR_TAIL:
            mine = tags[pending]
            homes = self._homes(mine)
            # per home: bitmasks of the slots holding this tag, and of the free slots
            rows = [np.take(self._tags, home, axis=0) for home in homes]
            matches = [_bitmask(row == mine[:, None]) for row in rows]
            frees = [_bitmask(row == 0) for row in rows]
            in_second = matches[0] == 0
            present = ~in_second | (matches[1] != 0)
            hit = np.flatnonzero(present)
            bucket = np.where(in_second, homes[1], homes[0])[hit]
            column = _LOWEST_BIT[np.where(in_second, matches[1], matches[0])[hit]]
            found[pending[hit]] = _ENCODE - self._values[bucket, column].astype(np.int64)

            # absent: into the home with more free slots; on a tie a tag bit decides,
            # so keys of one batch (which all see one snapshot) still spread
            room = (_POPCOUNT[frees[0]], _POPCOUNT[frees[1]])
            to_second = (room[1] > room[0]) | ((room[1] == room[0]) & ((mine & _U32(4)) != 0))
            claim = np.flatnonzero(~present & ((room[0] | room[1]) != 0))
            to_second = to_second[claim]
            free_bits = np.where(to_second, frees[1][claim], frees[0][claim])
            # contenders for one bucket spread over its free slots by their tags' low bits
            column = _SPREAD_BIT[free_bits * _BUCKET + (mine[claim] & _U32(_BUCKET - 1))]
            slots = np.where(to_second, homes[1][claim], homes[0][claim]) * _BUCKET + column
            won, repeat_of = self._claim(slots, mine[claim], encoded[pending[claim]])
            found[pending[claim[won]]] = repeat_of[won]

            full = np.flatnonzero(~present & ((room[0] | room[1]) == 0))
            found[pending[full]] = self._probe_chain(mine[full], encoded[pending[full]], homes[1][full] + 1)
            settled = np.zeros(len(pending), dtype=bool)
            settled[hit] = settled[claim[won]] = settled[full] = True
            pending = pending[~settled]  # the rest lost a contested slot: look again
        if pending.size:
            found[pending] = self._probe_one_by_one(tags[pending], encoded[pending])
        return found

    def _claim(self, slots: np.ndarray, tags: np.ndarray, encoded: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Keys write their tags into free slots and the tag that stayed owns the
        slot; equal tags all win, and the smallest value among them is kept.
        Returns who won and, per key, -1 if its own value was stored or else
        the stored value."""
        flat_tags, flat_values = self._tags.reshape(-1), self._values.reshape(-1)
        flat_tags[slots] = tags
        won = flat_tags[slots] == tags
        np.maximum.at(flat_values, slots[won], encoded[won])
        kept = flat_values[slots]
        repeat_of = np.where(kept == encoded, -1, _ENCODE - kept.astype(np.int64))
        self._count += int(np.count_nonzero(won & (repeat_of == -1)))
        return won, repeat_of

    def _probe_one_by_one(self, tags: np.ndarray, encoded: np.ndarray) -> np.ndarray:
        """`_probe` in plain Python for a few keys, in order: of equal tags the
        first inserts and the later ones find it."""
        found = np.full(len(tags), -1, dtype=np.int64)
        homes = self._homes(tags)
        for i, (tag, first, second) in enumerate(zip(tags.tolist(), homes[0].tolist(), homes[1].tolist())):
            rows = (self._tags[first].tolist(), self._tags[second].tolist())
            for bucket, row in ((first, rows[0]), (second, rows[1])):
                if tag in row:
                    found[i] = _ENCODE - int(self._values[bucket, row.index(tag)])
                    break
            else:
                room = (rows[0].count(0), rows[1].count(0))
                if max(room):
                    second_side = room[1] > room[0] or (room[1] == room[0] and tag >> 2 & 1)
                    bucket, row = (second, rows[1]) if second_side else (first, rows[0])
                    self._store(bucket, row.index(0), tag, encoded[i])
                else:
                    found[i] = self._chain_one(tag, encoded[i], second + 1)
        return found

    def _probe_chain(self, tags: np.ndarray, encoded: np.ndarray, buckets: np.ndarray) -> np.ndarray:
        """Bucket-by-bucket probing after the second home (both homes were full),
        vectorised over the keys; the last few go one by one."""
        found = np.full(len(tags), -1, dtype=np.int64)
        pending = np.arange(len(tags))
        while pending.size > _SCALAR_TAIL:
            if buckets.max() >= len(self._tags):  # ran off the spare buckets
                break
            rows, mine = np.take(self._tags, buckets, axis=0), tags[pending]
            matches, frees = _bitmask(rows == mine[:, None]), _bitmask(rows == 0)
            hit = np.flatnonzero(matches)
            found[pending[hit]] = _ENCODE - self._values[buckets[hit], _LOWEST_BIT[matches[hit]]].astype(np.int64)
            claim = np.flatnonzero((matches == 0) & (frees != 0))
            column = _SPREAD_BIT[frees[claim] * _BUCKET + (mine[claim] & _U32(_BUCKET - 1))]
            won, repeat_of = self._claim(buckets[claim] * _BUCKET + column, mine[claim], encoded[pending[claim]])
            found[pending[claim[won]]] = repeat_of[won]
            settled = np.zeros(len(pending), dtype=bool)
            settled[hit] = settled[claim[won]] = True
            moved = buckets + ((matches == 0) & (frees == 0))  # losers of a claim look at the same bucket again
            pending, buckets = pending[~settled], moved[~settled]
        for i, tag, bucket in zip(pending.tolist(), tags[pending].tolist(), buckets.tolist()):
            found[i] = self._chain_one(tag, encoded[i], bucket)
        return found

    def _chain_one(self, tag: int, encoded: np.uint32, bucket: int) -> int:
        """One key's chain from `bucket` on: its stored value, or -1 once inserted."""
        while True:
            if bucket >= len(self._tags):  # ran off the spare buckets: grow, then start over
                self._grow(int(self._max_load * self._home_buckets * _BUCKET) * 2)  # double once
                return int(self._probe(np.array([tag], dtype=_U32), np.array([encoded], dtype=_U32))[0])
            row = self._tags[bucket].tolist()
            if tag in row:
                return _ENCODE - int(self._values[bucket, row.index(tag)])
            if 0 in row:
                self._store(bucket, row.index(0), tag, encoded)
                return -1
            bucket += 1

    def _store(self, bucket: int, column: int, tag: int, encoded: np.uint32) -> None:
        self._tags[bucket, column] = tag
        self._values[bucket, column] = encoded
        self._count += 1

    def _grow(self, needed: int) -> None:
        """Double the home buckets until `needed` keys fit. With multiply-shift
        homes, doubling sends both homes of every key in old bucket b to new
        bucket 2b or 2b + 1, so each key moves to a child of its bucket in the
        same column: a vectorised copy, no probing, done a slice of buckets at
        a time to keep the temporary arrays small. Keys that had chained past
        their homes are inserted again."""
        while needed > self._max_load * self._home_buckets * _BUCKET:
            old_tags, old_values, count = self._tags, self._values, self._count
            self._allocate(self._home_buckets * 2)
            chained: list[tuple[np.ndarray, np.ndarray]] = []
            for first_bucket in range(0, len(old_tags), _GROW_SLICE_BUCKETS):
                block = old_tags[first_bucket : first_bucket + _GROW_SLICE_BUCKETS]
                bucket, column = np.nonzero(block)
                tags, values = block[bucket, column], old_values[first_bucket + bucket, column]
                bucket += first_bucket
                first, second = self._homes(tags)
                at_first, at_second = first >> 1 == bucket, second >> 1 == bucket
                home = at_first | at_second
                child = np.where(at_first, first, second)[home]
                self._tags[child, column[home]] = tags[home]
                self._values[child, column[home]] = values[home]
                chained.append((tags[~home], values[~home]))
            del old_tags, old_values
            tags, values = (np.concatenate(parts) for parts in zip(*chained))
            self._count = count - len(tags)
            self._probe(tags, values)

    def _allocate(self, home_buckets: int) -> None:
        self._home_buckets = home_buckets
        self._count = 0
        self._tags = np.zeros((home_buckets + _OVERFLOW_BUCKETS, _BUCKET), dtype=_U32)
        self._values = np.zeros((home_buckets + _OVERFLOW_BUCKETS, _BUCKET), dtype=_U32)

    def _homes(self, tags: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Two home buckets per tag: multiply-shift hashes onto [0, home_buckets)."""
        wide = tags.astype(_U64)
        return tuple(((((wide * multiplier) >> _U64(32)) * _U64(self._home_buckets)) >> _U64(32)).astype(np.intp)
                     for multiplier in _HOME_MULTIPLIERS)


def _bitmask(rows: np.ndarray) -> np.ndarray:
    """(..., 4) booleans → ints with bit i set when column i is: the four bool
    bytes read as one little-endian uint32, their low bits gathered."""
    word = np.ascontiguousarray(rows).view("<u4")[..., 0]
    return ((word | (word >> 7) | (word >> 14) | (word >> 21)) & 0xF).astype(np.intp)


def _bit_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    masks = range(1 << _BUCKET)
    popcount = np.array([bin(m).count("1") for m in masks], dtype=np.intp)
    lowest = np.array([(m & -m).bit_length() - 1 if m else 0 for m in masks], dtype=np.intp)
    spread = np.zeros((1 << _BUCKET, _BUCKET), dtype=np.intp)  # [free mask, j]: the j-th free slot, cycling
    for m in masks:
        bits = [i for i in range(_BUCKET) if m >> i & 1] or [0]
        spread[m] = [bits[j % len(bits)] for j in range(_BUCKET)]
    return popcount, lowest, spread.reshape(-1)


_POPCOUNT, _LOWEST_BIT, _SPREAD_BIT = _bit_tables()
