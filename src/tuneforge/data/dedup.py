"""Exact and near duplicates, streaming: each text is compared with every text added before it.

Exact: the 64-bit hash of the normalised text (`minhash.normalize_text`: NFKC,
casefold, whitespace collapsed, stripped). A repeat is reported with the line
of the first occurrence.

Near: MinHash LSH over character n-grams (default 5) of the normalised text.
Band keys of every distinct text go into one table; a text whose band key is
already there is a *candidate* pair, and a candidate is reported only if the
Jaccard similarity estimated from the two signatures reaches the threshold.

Verification uses the MinHash estimate, not the exact Jaccard of the n-gram
sets: the exact value needs the earlier text, and keeping a million texts is
what this module avoids. The estimate is unbiased with standard deviation
sqrt(J(1-J)/num_perm) (0.026 at J = 0.9, num_perm = 128), so pairs well below
the threshold (J ≤ 0.8: < 0.3% each) are not reported, while pairs within a
few hundredths of it can go either way; raise num_perm for a sharper edge.

Memory per distinct text, with the defaults: a 4-bit signature (64 bytes),
12 band-table slots (8 bytes each, table 50–75% full), an exact-table slot
(12 bytes) and its line (8 bytes) — ~250 bytes, ~250 MB for a million rows;
texts are never kept.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from tuneforge.data.example import Example, Finding
from tuneforge.data.keytable import KeyTable
from tuneforge.data.minhash import MinHasher, mix64, normalize_batch

CHUNK_ROWS = 2048  # rows sketched together: big enough for numpy, small enough to stay in cache
SIGNATURE_BITS = 4  # bits kept per signature value for verification (b-bit MinHash)
MIN_CANDIDATE_RECALL = 0.99  # LSH: chance a pair exactly at the threshold shares a band
_BAND_WEIGHT_SEED = 7


def lsh_bands(threshold: float, num_perm: int) -> tuple[int, int]:
    """(bands, rows per band): the most rows per band (fewest spurious
    candidates) that still finds a pair at the threshold with
    MIN_CANDIDATE_RECALL."""
    for rows in range(num_perm, 0, -1):
        bands = num_perm // rows
        if 1 - (1 - threshold**rows) ** bands >= MIN_CANDIDATE_RECALL:
            return bands, rows
    return num_perm, 1


class Deduplicator:
    """Streaming exact + near duplicate detection; the first occurrence is kept."""

    def __init__(self, threshold: float = 0.9, num_perm: int = 128, ngram_chars: int = 5, seed: int = 0,
                 near: bool = True) -> None:
        """`near=False`: exact duplicates only (no sketches, a fraction of the cost)."""
        if not 0.0 < threshold <= 1.0:
            raise ValueError("threshold must be within (0, 1]")
        self.threshold = threshold
        self.near = near
        self.num_perm = num_perm
        self._hasher = MinHasher(num_perm=num_perm, ngram_chars=ngram_chars, seed=seed)
        self._bands, self._rows_per_band = lsh_bands(threshold, num_perm)
        rng = np.random.default_rng([seed, _BAND_WEIGHT_SEED])
        self._band_weights = rng.integers(1, 2**63, size=self._rows_per_band, dtype=np.uint64) | np.uint64(1)
        self._band_salts = rng.integers(0, 2**63, size=self._bands, dtype=np.uint64)
        self._exact = KeyTable()
        self._exact_keys = _GrowingInts()  # per row: its full 64-bit key, to verify the table's answers
        self._exact_overflow: dict[int, int] = {}  # keys whose 32-bit tag an earlier, different key holds
        self._band_table = KeyTable()
        self._signatures = _PackedSignatures(num_perm)
        self._row_lines = _GrowingInts()
        self._duplicates: set[int] = set()

    def add_batch(self, lines: Sequence[int], texts: Sequence[str]) -> list[Finding]:
        """Findings for the texts that repeat an earlier one (in this batch or before)."""
        if len(lines) != len(texts):
            raise ValueError("lines and texts differ in length")
        findings: list[Finding] = []
        for start in range(0, len(texts), CHUNK_ROWS):
            findings += self._add_chunk(list(lines[start : start + CHUNK_ROWS]),
                                        list(texts[start : start + CHUNK_ROWS]))
        self._duplicates.update(finding.line for finding in findings)
        return findings

    def add_examples(self, examples: Sequence[Example]) -> list[Finding]:
        return self.add_batch([example.line for example in examples], [e.joined_text() for e in examples])

    def duplicate_lines(self) -> set[int]:
        """Lines reported so far, for a job that removes duplicates."""
        return set(self._duplicates)

    @property
    def nbytes(self) -> int:
        """Memory held by the indexes (grows with distinct texts, not with text length)."""
        return (self._exact.nbytes + self._exact_keys.nbytes + self._band_table.nbytes
                + self._signatures.nbytes + self._row_lines.nbytes)

    def _add_chunk(self, lines: list[int], texts: list[str]) -> list[Finding]:
        batch = normalize_batch(texts)
        hashes = np.fromiter(map(hash, batch.texts), dtype=np.int64, count=len(texts))
        keys = mix64(hashes.view(np.uint64))
        row_ids = len(self._row_lines) + np.arange(len(texts), dtype=np.int64)
        self._row_lines.extend(np.asarray(lines, dtype=np.int64))
        earlier = self._exact_matches(keys, row_ids)  # first occurrence's row id, or -1
        findings = [Finding(line=lines[i], kind="exact_duplicate",
                            detail={"duplicate_of": self._row_lines[earlier[i]]})
                    for i in np.flatnonzero(earlier >= 0)]

        if not self.near:
            return findings
        signature = self._hasher.signatures(batch, keys)
        self._signatures.extend(signature)
        # texts shorter than one n-gram have a single "n-gram": only exact repeats match them
        near = np.flatnonzero((earlier < 0) & (batch.lengths >= self._hasher.ngram_chars))
        findings += self._near_duplicates(signature[near], row_ids[near], [lines[i] for i in near])
        findings.sort(key=lambda finding: finding.line)
        return findings

    def _exact_matches(self, keys: np.ndarray, row_ids: np.ndarray) -> np.ndarray:
        self._exact_keys.extend(keys.view(np.int64))
        earlier = self._exact.lookup_or_insert(keys, row_ids)
        collided = np.flatnonzero((earlier >= 0) & (self._exact_keys.take(earlier) != keys.view(np.int64)))
        for i in collided:  # same tag, different text: ~1 in 4e9 pairs, so a dict is plenty
            earlier[i] = self._exact_overflow.setdefault(int(keys[i]), int(row_ids[i]))
            if earlier[i] == row_ids[i]:
                earlier[i] = -1
        return earlier

    def _near_duplicates(self, signature: np.ndarray, row_ids: np.ndarray, lines: list[int]) -> list[Finding]:
        if not len(row_ids):
            return []
        query = np.repeat(row_ids, self._bands)
        # per (row, band): the first earlier row whose band key is the same, or -1
        candidate = self._band_table.lookup_or_insert(self._band_keys(signature).ravel(), query)
        keep = (candidate >= 0) & (candidate < query)
        if not keep.any():
            return []
        pairs = np.unique(np.stack([query[keep], candidate[keep]], axis=1), axis=0)
        similarity = self._signatures.similarity(pairs[:, 0], pairs[:, 1])
        passed = similarity >= self.threshold
        pairs, similarity = pairs[passed], similarity[passed]
        # pairs are sorted by (query, candidate): a query's first pair is its earliest match
        _, first_pair = np.unique(pairs[:, 0], return_index=True)
        line_of = dict(zip(row_ids.tolist(), lines))
        return [Finding(line=line_of[int(pairs[i, 0])], kind="near_duplicate",
                        detail={"duplicate_of": self._row_lines[pairs[i, 1]],
                                "jaccard": round(float(similarity[i]), 4)})
                for i in first_pair]

    def _band_keys(self, signature: np.ndarray) -> np.ndarray:
        used = signature[:, : self._bands * self._rows_per_band].astype(np.uint64)
        bands = used.reshape(len(signature), self._bands, self._rows_per_band)
        keys = (bands * self._band_weights).sum(axis=2, dtype=np.uint64) + self._band_salts
        return mix64(keys)


class _PackedSignatures:
    """SIGNATURE_BITS-bit signatures of every distinct text, in fixed-size blocks
    (appending never copies what is stored)."""

    BLOCK_ROWS = 1 << 16

    def __init__(self, num_perm: int) -> None:
        self._num_perm = num_perm
        self._width = math.ceil(num_perm * SIGNATURE_BITS / 8)
        self._blocks: list[np.ndarray] = []
        self._rows = 0

    @property
    def nbytes(self) -> int:
        return sum(block.nbytes for block in self._blocks)

    def extend(self, signature: np.ndarray) -> None:
        low = (signature & np.uint32((1 << SIGNATURE_BITS) - 1)).astype(np.uint8)
        if low.shape[1] % 2:
            low = np.pad(low, ((0, 0), (0, 1)))
        packed = low[:, 0::2] | (low[:, 1::2] << np.uint8(4))
        done = 0
        while done < len(packed):
            block, offset = divmod(self._rows, self.BLOCK_ROWS)
            if block == len(self._blocks):
                self._blocks.append(np.zeros((self.BLOCK_ROWS, self._width), dtype=np.uint8))
            take = min(self.BLOCK_ROWS - offset, len(packed) - done)
            self._blocks[block][offset : offset + take] = packed[done : done + take]
            self._rows += take
            done += take

    def similarity(self, left: np.ndarray, right: np.ndarray) -> np.ndarray:
        """Estimated Jaccard of row pairs, corrected for b-bit chance agreement."""
        xor = self._gather(left) ^ self._gather(right)
        same = ((xor & np.uint8(0x0F)) == 0).sum(axis=1) + ((xor >> np.uint8(4)) == 0).sum(axis=1)
        same -= self._width * 2 - self._num_perm  # padding nibbles always agree
        chance = 2.0**-SIGNATURE_BITS
        return np.clip((same / self._num_perm - chance) / (1 - chance), 0.0, 1.0)

    def _gather(self, rows: np.ndarray) -> np.ndarray:
        block, offset = np.divmod(rows, self.BLOCK_ROWS)
        out = np.empty((len(rows), self._width), dtype=np.uint8)
        for b in np.unique(block):
            mask = block == b
            out[mask] = self._blocks[b][offset[mask]]
        return out


class _GrowingInts:
    """An int64 array that appends in amortised O(1)."""

    def __init__(self) -> None:
        self._data = np.zeros(1024, dtype=np.int64)
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def __getitem__(self, index: int) -> int:
        return int(self._data[index])

    def take(self, indices: np.ndarray) -> np.ndarray:
        return self._data[indices]

    @property
    def nbytes(self) -> int:
        return self._data.nbytes

    def extend(self, values: np.ndarray) -> None:
        needed = self._size + len(values)
        if needed > len(self._data):
            grown = np.zeros(max(needed, len(self._data) * 2), dtype=np.int64)
            grown[: self._size] = self._data[: self._size]
            self._data = grown
        self._data[self._size : needed] = values
        self._size = needed
