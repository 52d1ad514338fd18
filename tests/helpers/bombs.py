"""Small hostile uploads for the bounds on tenant data: each is a few kilobytes
that a reader without bounds turns into gigabytes of memory or disk."""

from __future__ import annotations

import io
import json
import tarfile

GIB = 1024**3


def sparse_tar(real_size_bytes: int = 2 * GIB, name: str = "ds/state.json") -> bytes:
    """A tar whose one member is a PAX 1.0 sparse file: a 512-byte map and one data byte that
    `tarfile.extractfile` expands to `real_size_bytes` (holes read as zeros)."""
    block = f"1\n{real_size_bytes - 1}\n1\n".encode().ljust(512, b"\0") + b"x"
    info = tarfile.TarInfo(name)
    info.size = len(block)
    info.pax_headers = {"GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.name": name,
                        "GNU.sparse.realsize": str(real_size_bytes)}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        archive.addfile(info, io.BytesIO(block))
    return buffer.getvalue()


def zstd_arrow_shard(decoded_bytes: int = 64 * 1024**2, ipc_file: bool = False) -> bytes:
    """An Arrow IPC shard (stream format unless `ipc_file`) of one record batch whose `text`
    column holds `decoded_bytes` of repeated characters, zstd-compressed to a few kilobytes."""
    import pyarrow as pa

    rows = max(1, decoded_bytes // (1024 * 1024))
    table = pa.table({"text": ["a" * (decoded_bytes // rows)] * rows})
    sink = pa.BufferOutputStream()
    opener = pa.ipc.new_file if ipc_file else pa.ipc.new_stream
    with opener(sink, table.schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as writer:
        writer.write_table(table, max_chunksize=rows)  # one batch: decompressed whole when read
    return sink.getvalue().to_pybytes()


def saved_dataset_tar(shard: bytes, gzip: bool = True) -> bytes:
    """A tar(.gz) of a saved dataset (datasets' save_to_disk layout) holding one shard."""
    state = json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}).encode()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz" if gzip else "w") as archive:
        for name, data in (("ds/state.json", state), ("ds/data-00000-of-00001.arrow", shard)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def phone_line_jsonl(target_bytes: int = 1_500_000) -> bytes:
    """One JSONL chat example whose text is ~`target_bytes` of phone numbers (each one a PII
    match: before the fix, resolving 100k overlapping candidates took minutes)."""
    unit = "call (212) 555-0147 "
    text = unit * (target_bytes // len(unit))
    example = {"messages": [{"role": "user", "content": text}, {"role": "assistant", "content": "ok"}]}
    return (json.dumps(example) + "\n").encode()
