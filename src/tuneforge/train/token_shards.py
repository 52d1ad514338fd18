"""A tokenized dataset that lives on disk, not in memory: examples streamed into shards.

The trainer reads a prepared JSONL file a line at a time, tokenizes each
example and appends it to the current shard, a flat file of the examples'
token ids and loss flags; a shard that reaches `SHARD_BYTES` is closed and,
for a prepared dataset, stored beside the dataset in the object store (a later
attempt or job on the same data downloads the shards instead of tokenizing
again; `index.json`, written last, says the set is complete). Nothing holds
more than one shard's write buffer and the per-example offsets (8 bytes an
example) in memory, whatever the file's size.

A shard file holds, for its `n` examples of `t` tokens in all:

    int64 n | int64 t | int32 lengths[n] | int32 units[n] | ids[t] | uint8 targets[t]

`ids` are uint16 when the tokenizer's vocabulary fits (else int32); `targets`
is 1 where a token carries loss (its label is its id) and 0 where it does not
(its label is IGNORE_INDEX), which is all a label can be for the token
objectives; `units` is each example's count of predicted targets (its loss
tokens after the first position), so a step's normaliser needs no tokens.

`TokenShards` is a read-only sequence over the shards: `len()` and
`shards[i]` (a `TokenizedExample`, read with one `pread` of each array; the
page cache, not the process, holds what was read), so the trainer's seeded
per-epoch permutation (`batches.epoch_order`) and exact resume at
(epoch, index in epoch) work on it as on a list, and each rank reads only the
examples of its own share of a step.

A prepared dataset larger than `TOKENIZE_AHEAD_MAX_BYTES` is not tokenized
ahead at all: `OnDemand` copies the file to local disk, indexes where each
line starts, and tokenizes an example when a step reads it (each epoch again:
tokenizing a step's examples costs far less than the step). Training starts
without a pass over the data, and memory holds 8 bytes a line.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import tempfile
import weakref
from abc import abstractmethod
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, overload

import numpy as np

from tuneforge.data.tokenize import IGNORE_INDEX, TokenizedExample
from tuneforge.domain.digests import file_sha256
from tuneforge.storage.store import ObjectStore

FORMAT_VERSION = 2
SHARD_BYTES = 64 * 1024 * 1024  # a shard is closed (and stored) past this many bytes of tokens
# A prepared dataset larger than this is tokenized on demand (`OnDemand`) rather than ahead
TOKENIZE_AHEAD_MAX_BYTES = 256 * 1024 * 1024
INDEX_NAME = "index.json"
_HEADER = struct.Struct("<qq")


def id_dtype(vocab_size: int) -> np.dtype:
    """The narrowest type that holds every token id of a vocabulary of `vocab_size`."""
    return np.dtype(np.uint16) if vocab_size <= np.iinfo(np.uint16).max + 1 else np.dtype(np.int32)


def example_units(example: TokenizedExample) -> int:
    """Tokens predicted with loss (the model never predicts position 0)."""
    return sum(label != IGNORE_INDEX for label in example.labels[1:])


class _ShardWriter:
    """Collects examples into shard files in `folder`, closing one past `SHARD_BYTES`. The ids and
    loss flags go to two spill files as they come (a file's buffer in memory, not the shard), and
    are copied behind the header when the shard closes."""

    def __init__(self, folder: Path, dtype: np.dtype, on_shard: Callable[[Path], None]) -> None:
        self.folder, self.dtype, self.on_shard = folder, dtype, on_shard
        self.shards: list[dict[str, Any]] = []
        self._open()

    def _open(self) -> None:
        self.lengths, self.units = array("i"), array("i")
        self.tokens = 0
        self.ids_spill = open(self.folder / "ids.spill", "w+b")  # noqa: SIM115 - closed in close_shard
        self.targets_spill = open(self.folder / "targets.spill", "w+b")  # noqa: SIM115

    def add(self, example: TokenizedExample) -> None:
        ids = np.asarray(example.input_ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() > np.iinfo(self.dtype).max):
            raise ValueError(f"token id out of the range of {self.dtype}")
        labels = np.asarray(example.labels, dtype=np.int64)
        targets = labels != IGNORE_INDEX
        if not np.array_equal(labels[targets], ids[targets]):
            raise ValueError("a label that is neither its token's id nor IGNORE_INDEX")
        self.lengths.append(len(ids))
        self.units.append(int(targets[1:].sum()))
        self.ids_spill.write(ids.astype(self.dtype).tobytes())
        self.targets_spill.write(targets.astype(np.uint8).tobytes())
        self.tokens += len(ids)
        if self.tokens * (self.dtype.itemsize + 1) >= SHARD_BYTES:
            self.close_shard()
            self._open()

    def close_shard(self) -> None:
        spills = (self.ids_spill, self.targets_spill)
        try:
            if self.lengths:
                self._write_shard()
        finally:
            for spill in spills:
                spill.close()
                os.unlink(spill.name)

    def _write_shard(self) -> None:
        path = self.folder / f"shard-{len(self.shards):05d}.bin"
        digest = hashlib.sha256()
        with open(path, "wb") as out:
            def put(part: bytes) -> None:
                out.write(part)
                digest.update(part)

            for part in (_HEADER.pack(len(self.lengths), self.tokens), self.lengths.tobytes(), self.units.tobytes()):
                put(part)
            for spill in (self.ids_spill, self.targets_spill):
                spill.flush()
                spill.seek(0)
                while chunk := spill.read(1 << 20):
                    put(chunk)
        self.shards.append({"name": path.name, "examples": len(self.lengths), "tokens": self.tokens,
                            "bytes": path.stat().st_size, "sha256": digest.hexdigest()})
        self.on_shard(path)


class _Examples(Sequence[TokenizedExample]):
    """A read-only sequence of examples read one at a time (`_read`), sliced into lists."""

    @overload
    def __getitem__(self, index: int) -> TokenizedExample: ...
    @overload
    def __getitem__(self, index: slice) -> list[TokenizedExample]: ...

    def __getitem__(self, index: int | slice) -> TokenizedExample | list[TokenizedExample]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        index = int(index)
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"example {index} of {len(self)}")
        return self._read(index)

    def __iter__(self) -> Iterator[TokenizedExample]:
        for index in range(len(self)):
            yield self[index]

    @abstractmethod
    def _read(self, index: int) -> TokenizedExample:
        """Example `index` (0 <= index < len)."""


class TokenShards(_Examples):
    """Tokenized examples in shard files of `folder` (see the module's docstring), read on demand."""

    def __init__(self, folder: Path, index: dict[str, Any], *, owned: bool = False) -> None:
        self.folder = folder
        self.dtype = np.dtype(index["id_dtype"])
        self.num_tokens = int(index["tokens"])
        shards = index["shards"]
        counts = np.array([shard["examples"] for shard in shards], dtype=np.int64)
        self._first = np.concatenate([[0], np.cumsum(counts)])  # the global index of each shard's first example
        self._fds: list[int] = []
        self._starts: list[np.ndarray] = []  # per shard: each example's first token (and the shard's total)
        self._units: list[np.ndarray] = []
        self._ids_at: list[int] = []  # per shard: the byte offsets of its ids and its targets
        self._targets_at: list[int] = []
        for shard in shards:
            fd = os.open(folder / shard["name"], os.O_RDONLY)
            self._fds.append(fd)
            count, tokens = _HEADER.unpack(os.pread(fd, _HEADER.size, 0))
            lengths = np.frombuffer(os.pread(fd, 4 * count, _HEADER.size), dtype=np.int32)
            self._units.append(np.frombuffer(os.pread(fd, 4 * count, _HEADER.size + 4 * count), dtype=np.int32))
            self._starts.append(np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]))
            ids_at = _HEADER.size + 8 * count
            self._ids_at.append(ids_at)
            self._targets_at.append(ids_at + self.dtype.itemsize * tokens)
        self._finalizer = weakref.finalize(self, _release, list(self._fds), folder if owned else None)

    def __len__(self) -> int:
        return int(self._first[-1])

    def _read(self, index: int) -> TokenizedExample:
        shard = int(np.searchsorted(self._first, index, side="right")) - 1
        local = index - int(self._first[shard])
        start, end = int(self._starts[shard][local]), int(self._starts[shard][local + 1])
        fd, size = self._fds[shard], self.dtype.itemsize
        ids = np.frombuffer(os.pread(fd, size * (end - start), self._ids_at[shard] + size * start), dtype=self.dtype)
        targets = np.frombuffer(os.pread(fd, end - start, self._targets_at[shard] + start), dtype=np.uint8)
        input_ids = ids.astype(np.int64)
        labels = np.where(targets.astype(bool), input_ids, IGNORE_INDEX)
        return TokenizedExample(input_ids.tolist(), labels.tolist())

    def units(self, indices: Iterable[int]) -> int:
        """The predicted targets of these examples together, read from the shards' headers."""
        total = 0
        for index in indices:
            shard = int(np.searchsorted(self._first, index, side="right")) - 1
            total += int(self._units[shard][index - int(self._first[shard])])
        return total

    def close(self) -> None:
        self._finalizer()


def _release(fds: list[int], folder: Path | None) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


def build(examples: Iterable[TokenizedExample], vocab_size: int, *, store: ObjectStore | None = None,
          prefix: str | None = None) -> TokenShards:
    """Shards of `examples` in a scratch folder of this process (removed with the returned
    object); with `store` and `prefix`, each shard is stored as it closes and the index last."""
    folder = Path(tempfile.mkdtemp(prefix="tuneforge-tokens-"))
    try:
        dtype = id_dtype(vocab_size)

        def stored(path: Path) -> None:
            if store is not None and prefix is not None:
                store.put_file(f"{prefix}/{path.name}", path)

        writer = _ShardWriter(folder, dtype, stored)
        for example in examples:
            writer.add(example)
        writer.close_shard()
        shards = writer.shards
        index = {"version": FORMAT_VERSION, "id_dtype": dtype.name, "shards": shards,
                 "examples": sum(s["examples"] for s in shards), "tokens": sum(s["tokens"] for s in shards)}
        if store is not None and prefix is not None:
            store.put_bytes(f"{prefix}/{INDEX_NAME}", json.dumps(index).encode())
        (folder / INDEX_NAME).write_text(json.dumps(index))
        return TokenShards(folder, index, owned=True)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise


def fetch(store: ObjectStore, prefix: str) -> TokenShards | None:
    """The stored shards under `prefix` in a scratch folder, or None when the set is not complete
    (no index yet) or a shard does not match the index (then it is built again)."""
    index_key = f"{prefix}/{INDEX_NAME}"
    if not store.exists(index_key):
        return None
    index = json.loads(store.get_bytes(index_key))
    if index.get("version") != FORMAT_VERSION:
        return None
    folder = Path(tempfile.mkdtemp(prefix="tuneforge-tokens-"))
    try:
        for shard in index["shards"]:
            path = folder / shard["name"]
            store.get_file(f"{prefix}/{shard['name']}", path)
            if file_sha256(path) != shard["sha256"]:
                shutil.rmtree(folder, ignore_errors=True)
                return None
        return TokenShards(folder, index, owned=True)
    except (FileNotFoundError, KeyError):  # a shard went missing since the index was read: built again
        shutil.rmtree(folder, ignore_errors=True)
        return None
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise


class OnDemand(_Examples):
    """The examples of a local JSONL file of one example a line (a prepared dataset), each
    tokenized when it is read: an index of where each line starts (8 bytes a line) is all that
    is built ahead, so a file of any size starts training at once and a rank tokenizes only
    the examples of its own share of each step."""

    def __init__(self, path: Path, encode: Callable[[int, bytes], TokenizedExample], *,
                 owned: Path | None = None) -> None:
        self.path, self.encode = path, encode
        self._starts = line_starts(path)
        self._fd = os.open(path, os.O_RDONLY)
        self._finalizer = weakref.finalize(self, _release, [self._fd], owned)

    def __len__(self) -> int:
        return len(self._starts) - 1

    def _read(self, index: int) -> TokenizedExample:
        start, end = int(self._starts[index]), int(self._starts[index + 1])
        return self.encode(index + 1, os.pread(self._fd, end - start, start))

    def close(self) -> None:
        self._finalizer()


def line_starts(path: Path, chunk_bytes: int = 8 << 20) -> np.ndarray:
    """Where each line of `path` starts, and the file's end: int64[lines + 1]. A last line
    without its newline counts; one read pass, a chunk at a time."""
    found = [np.zeros(1, dtype=np.int64)]
    size = 0
    with open(path, "rb") as stream:
        while chunk := stream.read(chunk_bytes):
            ends = np.flatnonzero(np.frombuffer(chunk, dtype=np.uint8) == 0x0A).astype(np.int64)
            found.append(ends + size + 1)
            size += len(chunk)
    starts = np.concatenate(found)
    if starts[-1] != size:  # the last line has no newline: its end is the file's
        starts = np.append(starts, size)
    return starts
