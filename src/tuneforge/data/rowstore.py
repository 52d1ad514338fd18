"""Compact per-row stores for streaming dedup: what is kept of every row, by row id.

- `GrowingInts`: an int64 per row (lines, full exact keys).
- `PackedSignatures`: b-bit MinHash signatures (4 bits a value: 64 bytes a row
  at 128 values), a cheap similarity estimate to discard hopeless candidates.
- `TextSpool`: the normalised texts themselves, appended to an anonymous
  temporary file (deleted when closed; the OS page cache, not this process,
  holds what fits in memory) and read back only for the rows that are
  near-duplicate candidates, so verification is exact while the process's
  memory does not grow with the texts.
"""

from __future__ import annotations

import math
import tempfile

import numpy as np

SIGNATURE_BITS = 4


class GrowingInts:
    """An int64 array that appends in amortised O(1)."""

    def __init__(self) -> None:
        self._data = np.zeros(1024, dtype=np.int64)
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def __getitem__(self, index: int) -> int:
        return int(self._data[index])

    @property
    def nbytes(self) -> int:
        return self._data.nbytes

    def take(self, indices: np.ndarray) -> np.ndarray:
        return self._data[: self._size][indices]

    def extend(self, values: np.ndarray) -> None:
        needed = self._size + len(values)
        if needed > len(self._data):
            grown = np.zeros(max(needed, len(self._data) * 2), dtype=np.int64)
            grown[: self._size] = self._data[: self._size]
            self._data = grown
        self._data[self._size : needed] = values
        self._size = needed


class PackedSignatures:
    """SIGNATURE_BITS-bit signatures, in fixed-size blocks (appending never copies what is stored)."""

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
        """Estimated Jaccard of row pairs, corrected for b-bit chance agreement
        (standard deviation ~sqrt(J(1-J)/num_perm))."""
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


class TextSpool:
    """Append-only texts by row id, in an anonymous temporary file."""

    def __init__(self) -> None:
        self._file = tempfile.TemporaryFile(prefix="tuneforge-dedup-")
        self._starts = GrowingInts()  # byte offset of each row's text; it ends one NUL before the next
        self._size_bytes = 0

    def __len__(self) -> int:
        return len(self._starts)

    @property
    def size_bytes(self) -> int:
        return self._size_bytes

    def extend(self, texts: list[str]) -> None:
        """Append texts (which hold no NUL; empty strings for rows never read back)."""
        blob = ("\x00".join(texts) + "\x00").encode()
        ends = np.flatnonzero(np.frombuffer(blob, dtype=np.uint8) == 0)
        starts = np.concatenate([[0], ends[:-1] + 1]) + self._size_bytes
        self._file.seek(self._size_bytes)
        self._file.write(blob)
        self._starts.extend(starts)
        self._size_bytes += len(blob)

    def get(self, rows: list[int]) -> dict[int, str]:
        """The texts of `rows`, read in file order."""
        texts = {}
        for row in sorted(set(rows)):
            start = self._starts[row]
            end = self._starts[row + 1] - 1 if row + 1 < len(self._starts) else self._size_bytes - 1
            self._file.seek(start)
            texts[row] = self._file.read(end - start).decode()
        return texts

    def close(self) -> None:
        self._file.close()
