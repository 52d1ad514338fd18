"""Exact and near duplicates, streaming: each text is compared with every text added before it.

Exact: a 64-bit hash of the normalised text (`minhash.normalize_text`: NFKC,
casefold, whitespace collapsed, stripped). A repeat is reported with the line
of the first occurrence. (The hash is Python's string hash, salted per
process: that changes which table slots are used, never a result.)

Near: MinHash LSH over character n-grams (default 5) of the normalised text
(one-permutation MinHash, see `minhash`). Band keys of every distinct text go
into one table; a text sharing a band key with an earlier text makes a
candidate pair, and a candidate is reported only if the **exact** Jaccard
similarity of the two n-gram sets reaches the threshold — so a pair at 0.85
is never reported at 0.9, whatever the hashing does. The earlier text is read
back from a spool (`rowstore.TextSpool`, an anonymous temporary file). A
4-bit signature estimate first drops candidates far below the threshold (by
PREFILTER_MARGIN, > 5 standard deviations), so the spool is read back for
real near-duplicates only.

Bands (`lsh_bands`): 6 bands of 5 values at threshold 0.9 — a pair at the
threshold is a candidate with probability 0.995 (0.998 at 0.92).

Memory per row with the defaults: 6 band-table slots (8 bytes each, the table
40-80% full), a 4-bit signature (64 bytes), an exact-table slot, the full key
and the line (~26 bytes): measured 160 MiB of indexes for a million rows
(`nbytes`). Texts go to the spool, not to memory.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tuneforge.data.example import Example, Finding
from tuneforge.data.keytable import KeyTable
from tuneforge.data.minhash import MinHasher, mix64, normalize_batch, pack_normalized
from tuneforge.data.rowstore import GrowingInts, PackedSignatures, TextSpool

CHUNK_ROWS = 2048  # rows sketched together: big enough for numpy, small enough to stay in cache
PREFILTER_MARGIN = 0.15  # candidates whose estimate is this far below the threshold are not read back
CANDIDATE_RECALL = 0.995  # LSH: chance that a pair exactly at the threshold shares a band
FAR_BELOW, MAX_FAR_CANDIDATES = 0.4, 0.2  # ... and at most this chance for a pair this far below it
_BAND_WEIGHT_SEED = 7


def lsh_bands(threshold: float, num_perm: int) -> tuple[int, int]:
    """(bands, rows per band). Verification is exact, so LSH only has to find
    the pairs: the fewest bands (each is a table lookup per row) such that a
    pair at the threshold becomes a candidate with probability ≥ CANDIDATE_RECALL
    while a pair FAR_BELOW under it does so at most MAX_FAR_CANDIDATES of the
    time (those are dropped by the signature estimate before any text is read).
    Threshold 0.9 at num_perm 128: 6 bands of 5."""
    far = max(threshold - FAR_BELOW, 0.05)
    for bands in range(1, num_perm + 1):
        for rows in range(num_perm // bands, 0, -1):
            if (_candidate_chance(threshold, rows, bands) >= CANDIDATE_RECALL
                    and _candidate_chance(far, rows, bands) <= MAX_FAR_CANDIDATES):
                return bands, rows
    return num_perm, 1


def _candidate_chance(similarity: float, rows: int, bands: int) -> float:
    return 1 - (1 - similarity**rows) ** bands


class Deduplicator:
    """Streaming exact + near duplicate detection; the first occurrence is kept.

    threshold: Jaccard similarity of the character n-gram sets from which a pair
        is a near duplicate (exact, not estimated).
    num_perm: MinHash values per text; more gives LSH bands a finer choice and
        the pre-filter a tighter estimate, at more time and 0.5 byte a value.
    ngram_chars: characters per n-gram (1-8).
    seed: the hash functions; findings do not depend on it (verification is
        exact) except through which pairs LSH proposes.
    near: False for exact duplicates only (no sketches: ~4x faster).
    """

    def __init__(self, threshold: float = 0.9, num_perm: int = 128, ngram_chars: int = 5, seed: int = 0,
                 near: bool = True) -> None:
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
        """Normalised text kept on disk for exact verification."""
        return self._texts.size_bytes

    def prepare(self, texts: list[str]) -> tuple[list[str], np.ndarray | None]:
        """The per-text work, independent of every other text: normalised texts
        and MinHash signatures. Another process may run it (with the same
        parameters) and hand the result to `add_prepared`."""
        batch = normalize_batch(texts)
        if not self.near:
            return batch.texts, None
        # rows shorter than one n-gram take their signature from this key; they are never near-matched
        keys = mix64(np.fromiter(map(hash, batch.texts), dtype=np.int64, count=len(texts)).view(np.uint64))
        return batch.texts, self._hasher.signatures(batch, keys)

    def add_prepared(self, lines: Sequence[int], normalized: list[str], signature: np.ndarray | None) -> list[Finding]:
        """Findings for texts that `prepare` turned into (normalised texts, signatures)."""
        findings = self._add_prepared(list(lines), normalized, signature)
        self._duplicates.update(finding.line for finding in findings)
        return findings

    def _add_chunk(self, lines: list[int], texts: list[str]) -> list[Finding]:
        return self._add_prepared(lines, *self.prepare(texts))

    def _add_prepared(self, lines: list[int], normalized: list[str], signature: np.ndarray | None) -> list[Finding]:
        if not normalized:
            return []
        hashes = np.fromiter(map(hash, normalized), dtype=np.int64, count=len(normalized))
        keys = mix64(hashes.view(np.uint64))
        row_ids = len(self._row_lines) + np.arange(len(normalized), dtype=np.int64)
        self._row_lines.extend(np.asarray(lines, dtype=np.int64))
        earlier = self._exact_matches(keys, row_ids)  # first occurrence's row id, or -1
        findings = [Finding(line=lines[i], kind="exact_duplicate",
                            detail={"duplicate_of": self._row_lines[earlier[i]]})
                    for i in np.flatnonzero(earlier >= 0)]

        if not self.near or signature is None:
            return findings
        self._signatures.extend(signature)
        lengths = np.fromiter(map(len, normalized), dtype=np.int64, count=len(normalized))
        # texts shorter than one n-gram have a single "n-gram": only exact repeats match them
        near = (earlier < 0) & (lengths >= self._hasher.ngram_chars)
        self._texts.extend([text if keep else "" for text, keep in zip(normalized, near.tolist())])
        rows = np.flatnonzero(near)
        findings += self._near_duplicates(signature[rows], row_ids[rows], [lines[i] for i in rows.tolist()],
                                          normalized, int(row_ids[0]))
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
                         chunk_texts: list[str], chunk_first_id: int) -> list[Finding]:
        """Near duplicates among the chunk's rows `row_ids` (chunk_texts[i] is row chunk_first_id + i)."""
        if not len(row_ids):
            return []
        query = np.repeat(row_ids, self._bands)
        # per (row, band): the first earlier row whose band key is the same, or -1
        candidate = self._band_table.lookup_or_insert(self._band_keys(signature).ravel(), query)
        keep = (candidate >= 0) & (candidate < query)
        if not keep.any():
            return []
        # distinct (query, candidate) pairs sorted by query then candidate: row ids are below 2**32
        # (KeyTable.MAX_VALUE), so one int64 per pair sorts the same (np.unique(axis=0) is ~100x slower)
        packed = np.unique((query[keep] << 32) | candidate[keep])
        pairs = np.stack([packed >> 32, packed & 0xFFFFFFFF], axis=1)
        hopeful = self._signatures.similarity(pairs[:, 0], pairs[:, 1]) >= self.threshold - PREFILTER_MARGIN
        pairs = pairs[hopeful]
        if not len(pairs):
            return []
        involved = set(pairs.ravel().tolist())
        texts = self._texts.get([row for row in involved if row < chunk_first_id])
        texts.update((row, chunk_texts[row - chunk_first_id]) for row in involved if row >= chunk_first_id)
        similarity = self._exact_jaccard(pairs, texts)
        passed = similarity >= self.threshold
        pairs, similarity = pairs[passed], similarity[passed]
        # pairs are sorted by (query, candidate): a query's first passing pair is its earliest match
        _, first_pair = np.unique(pairs[:, 0], return_index=True)
        line_of = dict(zip(row_ids.tolist(), lines))
        return [Finding(line=line_of[int(pairs[i, 0])], kind="near_duplicate",
                        detail={"duplicate_of": self._row_lines[pairs[i, 1]],
                                "jaccard": round(float(similarity[i]), 4)})
                for i in first_pair]

    def _exact_jaccard(self, pairs: np.ndarray, texts: dict[int, str]) -> np.ndarray:
        """Jaccard of the n-gram sets of each pair, on the 64-bit n-gram hashes
        (for Latin-1 text an n-gram's hash is a bijection of its characters, so
        this is the exact set Jaccard; elsewhere up to 2**-64 collisions)."""
        rows = sorted(set(pairs.ravel().tolist()))
        batch = pack_normalized([texts[row] for row in rows])
        hashes = self._hasher.ngram_hashes(batch, np.zeros(len(rows), dtype=np.uint64))
        sets = {row: _distinct(hashes[start : end + 1])
                for row, start, end in zip(rows, batch.starts.tolist(), batch.ends.tolist())}
        similarity = np.empty(len(pairs))
        for i, (row, other) in enumerate(pairs.tolist()):
            merged = np.concatenate([sets[row], sets[other]])
            merged.sort()
            shared = int(np.count_nonzero(merged[1:] == merged[:-1]))
            similarity[i] = shared / (len(merged) - shared)
        return similarity

    def _band_keys(self, signature: np.ndarray) -> np.ndarray:
        used = signature[:, : self._bands * self._rows_per_band].astype(np.uint64)
        bands = used.reshape(len(signature), self._bands, self._rows_per_band)
        keys = (bands * self._band_weights).sum(axis=2, dtype=np.uint64) + self._band_salts
        return mix64(keys)


def _distinct(values: np.ndarray) -> np.ndarray:
    """Sorted distinct values (np.unique's hashing path is slower on a few hundred values)."""
    values = np.sort(values)
    return values[np.concatenate(([True], values[1:] != values[:-1]))]
