"""What an Arrow IPC file will cost to read, found before a buffer is decompressed.

A record batch written with LZ4 or zstd body compression is decompressed whole
when pyarrow reads it: 10 KB of zstd can hold a 64 MiB batch. The sizes are in
the file before the data: each compressed buffer of a batch's body starts with
its uncompressed length (an int64, -1 when that buffer was stored plain), and
the batch's flatbuffer metadata says where each buffer is. This module walks
the IPC messages (zero-copy on a memory map), reads those lengths and refuses
the file when a batch or the whole file would expand past `ReadLimits`. Only
then does the reader decode batches.

The flatbuffer reading is the few fields needed (Message.header →
RecordBatch.buffers, DictionaryBatch.data), per Arrow's Message.fbs, with
every offset checked against the metadata's size.
"""

from __future__ import annotations

import struct
from typing import Any

from tuneforge.data.example import DataIssue
from tuneforge.data.limits import ReadLimits

_ARROW_FILE_MAGIC = b"ARROW1"
_FILE_PREAMBLE_BYTES = 8  # the magic padded to 8; the stream format follows it
# Message.fbs: Message {version: 0, header_type: 1, header: 2, bodyLength: 3}
_MESSAGE_HEADER_TYPE, _MESSAGE_HEADER = 1, 2
_RECORD_BATCH, _DICTIONARY_BATCH = 3, 2  # MessageHeader union tags
_RECORD_BATCH_BUFFERS, _RECORD_BATCH_COMPRESSION = 2, 3  # RecordBatch {length, nodes, buffers, compression}
_DICTIONARY_DATA = 1  # DictionaryBatch {id: 0, data: 1, isDelta: 2}
_BUFFER_STRUCT = struct.Struct("<qq")  # Buffer {offset: long, length: long}
_PREFIX = struct.Struct("<q")  # a compressed buffer's uncompressed length


class _Table:
    """One flatbuffer table inside `data`, reading only scalar and offset fields."""

    def __init__(self, data: bytes, position: int) -> None:
        self.data = data
        self.position = position
        vtable = position - _read(data, "<i", position)
        self.vtable = vtable
        self.vtable_bytes = _read(data, "<H", vtable)

    def _field(self, index: int) -> int | None:
        slot = 4 + 2 * index
        if slot + 2 > self.vtable_bytes:
            return None
        offset = _read(self.data, "<H", self.vtable + slot)
        return self.position + offset if offset else None

    def scalar(self, index: int, fmt: str, default: int = 0) -> int:
        where = self._field(index)
        return default if where is None else _read(self.data, fmt, where)

    def table(self, index: int) -> _Table | None:
        where = self._field(index)
        return None if where is None else _Table(self.data, where + _read(self.data, "<I", where))

    def structs(self, index: int, size: int) -> list[int]:
        """Start positions of a vector of fixed-size structs."""
        where = self._field(index)
        if where is None:
            return []
        start = where + _read(self.data, "<I", where)
        count = _read(self.data, "<I", start)
        if start + 4 + count * size > len(self.data):
            raise ValueError("a vector runs past the metadata")
        return [start + 4 + i * size for i in range(count)]


def _read(data: bytes, fmt: str, position: int) -> int:
    size = struct.calcsize(fmt)
    if position < 0 or position + size > len(data):
        raise ValueError("an offset points outside the metadata")
    return struct.unpack_from(fmt, data, position)[0]


def batch_buffers(metadata: bytes) -> tuple[list[tuple[int, int]], bool]:
    """(offset, length) of each body buffer of a record or dictionary batch message (none for
    other messages), and whether the body is compressed."""
    message = _Table(metadata, _read(metadata, "<I", 0))
    kind = message.scalar(_MESSAGE_HEADER_TYPE, "<B")
    header = message.table(_MESSAGE_HEADER)
    if header is None or kind not in (_RECORD_BATCH, _DICTIONARY_BATCH):
        return [], False
    batch = header if kind == _RECORD_BATCH else header.table(_DICTIONARY_DATA)
    if batch is None:
        return [], False
    buffers = [_BUFFER_STRUCT.unpack_from(metadata, at) for at in batch.structs(_RECORD_BATCH_BUFFERS, 16)]
    return buffers, batch.table(_RECORD_BATCH_COMPRESSION) is not None


def decoded_body_bytes(metadata: bytes, body: Any) -> int:
    """Bytes the batch's buffers take once decompressed (the body's own size when stored plain)."""
    buffers, compressed = batch_buffers(metadata)
    body_bytes = body.size if body is not None else 0
    if not compressed:
        return body_bytes
    view = memoryview(body) if body is not None else memoryview(b"")
    total = 0
    for offset, length in buffers:
        if offset < 0 or length < 0 or offset + length > body_bytes:
            raise ValueError("a buffer lies outside the batch body")
        if length < _PREFIX.size:
            total += length
            continue
        declared = _PREFIX.unpack_from(view, offset)[0]
        # -1: this buffer was stored plain (compressing it did not pay)
        total += length - _PREFIX.size if declared == -1 else max(declared, 0)
    return total


def check_ipc_expansion(source: Any, stored_bytes: int, limits: ReadLimits, where: str) -> int:
    """Refuse an Arrow IPC file (stream or file format, `source` a pyarrow buffer) that would
    decode past the limits; the bytes it decodes to otherwise."""
    import pyarrow as pa

    data = source.slice(_FILE_PREAMBLE_BYTES) if source.slice(0, 6).to_pybytes() == _ARROW_FILE_MAGIC else source
    try:
        messages = iter(pa.ipc.MessageReader.open_stream(pa.BufferReader(data)))
    except pa.ArrowException:
        # not IPC at all, so nothing here decodes: the reader that opens it next refuses it, naming
        # the problem (the bound holds, since that reader decodes nothing either)
        return 0
    total_bytes = 0
    while True:
        try:
            message = next(messages)
        except (StopIteration, pa.ArrowException):
            # a corrupt message stops pyarrow's reader at the same place, after the batches counted here
            return total_bytes
        if message.type not in ("record batch", "dictionary"):
            continue
        try:
            batch_bytes = decoded_body_bytes(message.metadata.to_pybytes(), message.body)
        except (ValueError, struct.error) as exc:
            raise DataIssue("invalid_arrow", f"cannot read {where} ({exc})", field=where) from None
        total_bytes += batch_bytes
        if batch_bytes > limits.max_batch_bytes:
            raise DataIssue("compression_bomb", f"{where}: a record batch decodes to {batch_bytes} bytes, more "
                            f"than max_batch_bytes ({limits.max_batch_bytes})", field=where)
        check_total(total_bytes, stored_bytes, limits, where)


def check_total(total_bytes: int, stored_bytes: int, limits: ReadLimits, where: str) -> None:
    if total_bytes > limits.max_decompressed_bytes:
        raise DataIssue("compression_bomb", f"{where} decodes to more than max_decompressed_bytes "
                        f"({limits.max_decompressed_bytes})", field=where)
    if total_bytes > limits.ratio_grace_bytes and total_bytes > limits.max_compression_ratio * max(stored_bytes, 1):
        raise DataIssue("compression_bomb", f"{where} expands more than max_compression_ratio "
                        f"({limits.max_compression_ratio:g}x: {stored_bytes} bytes hold {total_bytes})", field=where)
