"""Exact and near duplicates, streaming: each text is compared with every text added before it.

Exact: the 64-bit hash of the normalised text (`minhash.normalize_text`: NFKC,
casefold, whitespace collapsed, stripped). A repeat is reported with the line
of the first occurrence.

Near: MinHash LSH over character n-grams (default 5) of the normalised text
(one-permutation MinHash, see `minhash`). Band keys of every distinct text go
into one table; a text sharing a band key with an earlier text makes a
candidate pair, and a candidate is reported only if the **exact** Jaccard
similarity of the two n-gram sets reaches the threshold — so a pair at 0.85
is never reported at 0.9, whatever the hashing does. The earlier text is read
back from a spool (`rowstore.TextSpool`: memory up to 64 MiB, then a deleted
temporary file); a 4-bit signature estimate first drops candidates far below
the threshold (by PREFILTER_MARGIN, > 5 standard deviations), so the spool is
read for real near-duplicates only.

Bands: 12 bands of 10 values at num_perm 128 and threshold 0.9, chosen so a
pair exactly at the threshold shares a band with probability ≥ 0.99.

Memory per row with the defaults: ~12 band-table slots (8 bytes each, table
up to 80% full), a 4-bit signature (64 bytes), an exact-table slot, its full
key and its line (~26 bytes): ~200 bytes, ~200 MB for a million rows. Texts
go to the spool, not to memory.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from tuneforge.data.example import Example, Finding
from tuneforge.data.keytable import KeyTable
from tuneforge.data.minhash import MinHasher, mix64, ngram_set, normalize_batch
from tuneforge.data.rowstore import GrowingInts, PackedSignatures, TextSpool

CHUNK_ROWS = 2048  # rows sketched together: big enough for numpy, small enough to stay in cache
PREFILTER_MARGIN = 0.15  # candidates whose estimate is this far below the threshold are not read back
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
        self._exact_keys = GrowingInts()  # per row: its full 64-bit key, to verify the table's answers
        self._exact_overflow: dict[int, int] = {}  # keys whose 32-bit tag an earlier, different key holds
        self._band_table = KeyTable()
        self._signatures = PackedSignatures(num_perm)
        self._texts = TextSpool()
        self._row_lines = GrowingInts()
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

    def close(self) -> None:
        """Release the text spool (also done when the object is collected)."""
        self._texts.close()

    @property
    def nbytes(self) -> int:
        """Memory held by the indexes (grows with distinct texts, not with text length)."""
        return (self._exact.nbytes + self._exact_keys.nbytes + self._band_table.nbytes
                + self._signatures.nbytes + self._row_lines.nbytes)

    @property
    def spooled_bytes(self) -> int:
        """Normalised text kept for exact verification (in memory up to 64 MiB, then on disk)."""
        return self._texts.size_bytes

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
        near = (earlier < 0) & (batch.lengths >= self._hasher.ngram_chars)
        self._texts.extend([text if keep else "" for text, keep in zip(batch.texts, near.tolist())])
        rows = np.flatnonzero(near)
        findings += self._near_duplicates(signature[rows], row_ids[rows], [lines[i] for i in rows],
                                          {int(row_ids[i]): batch.texts[i] for i in rows})
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

    def _near_duplicates(self, signature: np.ndarray, row_ids: np.ndarray, lines: list[int],
                         chunk_texts: dict[int, str]) -> list[Finding]:
        if not len(row_ids):
            return []
        query = np.repeat(row_ids, self._bands)
        # per (row, band): the first earlier row whose band key is the same, or -1
        candidate = self._band_table.lookup_or_insert(self._band_keys(signature).ravel(), query)
        keep = (candidate >= 0) & (candidate < query)
        if not keep.any():
            return []
        pairs = np.unique(np.stack([query[keep], candidate[keep]], axis=1), axis=0)  # by (query, candidate)
        hopeful = self._signatures.similarity(pairs[:, 0], pairs[:, 1]) >= self.threshold - PREFILTER_MARGIN
        pairs = pairs[hopeful].tolist()
        earlier_texts = self._texts.get([c for _, c in pairs if c not in chunk_texts])
        texts = {**earlier_texts, **chunk_texts}
        line_of = dict(zip(row_ids.tolist(), lines))
        findings: list[Finding] = []
        grams: dict[int, frozenset[str]] = {}
        settled: set[int] = set()
        for row, other in pairs:  # a row's candidates come earliest first: its first match wins
            if row in settled:
                continue
            similarity = self._jaccard(row, other, texts, grams)
            if similarity >= self.threshold:
                settled.add(row)
                findings.append(Finding(line=line_of[row], kind="near_duplicate",
                                        detail={"duplicate_of": self._row_lines[other],
                                                "jaccard": round(similarity, 4)}))
        return findings

    def _jaccard(self, row: int, other: int, texts: dict[int, str], grams: dict[int, frozenset[str]]) -> float:
        for key in (row, other):
            if key not in grams:
                grams[key] = ngram_set(texts[key], self._hasher.ngram_chars)
        union = len(grams[row] | grams[other])
        return len(grams[row] & grams[other]) / union if union else 1.0

    def _band_keys(self, signature: np.ndarray) -> np.ndarray:
        used = signature[:, : self._bands * self._rows_per_band].astype(np.uint64)
        bands = used.reshape(len(signature), self._bands, self._rows_per_band)
        keys = (bands * self._band_weights).sum(axis=2, dtype=np.uint64) + self._band_salts
        return mix64(keys)
