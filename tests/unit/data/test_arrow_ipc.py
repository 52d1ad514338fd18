"""Arrow IPC and Parquet bounds: what a compressed batch or row group decodes to
is read from the file before it is decompressed."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.helpers.bombs import saved_dataset_tar, zstd_arrow_shard
from tuneforge.data import arrow_ipc
from tuneforge.data.example import DataIssue
from tuneforge.data.formats import iter_rows
from tuneforge.data.limits import MIB, ReadLimits


@pytest.mark.parametrize("ipc_file", [False, True])
@pytest.mark.parametrize("compression", [None, "zstd", "lz4"])
def test_declared_sizes_match_what_pyarrow_decodes(ipc_file: bool, compression: str | None) -> None:
    table = pa.table({"text": [f"row {n} " * 50 for n in range(3000)], "n": list(range(3000))})
    sink = pa.BufferOutputStream()
    opener = pa.ipc.new_file if ipc_file else pa.ipc.new_stream
    with opener(sink, table.schema, options=pa.ipc.IpcWriteOptions(compression=compression)) as writer:
        writer.write_table(table, max_chunksize=1000)
    data = sink.getvalue()
    decoded = arrow_ipc.check_ipc_expansion(data, data.size, ReadLimits(), "shard")
    # pyarrow's own size of the batches (buffers are padded to 8 bytes in the body)
    assert abs(decoded - table.get_total_buffer_size()) <= 64 * 3 * 8


def _saved_dataset(tmp_path: Path, shard: bytes) -> Path:
    directory = tmp_path / "ds"
    directory.mkdir()
    (directory / "data-00000-of-00001.arrow").write_bytes(shard)
    return directory


@pytest.mark.parametrize("ipc_file", [False, True])
def test_a_zstd_bomb_shard_is_refused_before_it_is_decompressed(tmp_path: Path, ipc_file: bool) -> None:
    shard = zstd_arrow_shard(64 * MIB, ipc_file=ipc_file)
    assert len(shard) < 20_000
    pool_before = pa.total_allocated_bytes()
    with pytest.raises(DataIssue) as caught:
        list(iter_rows(_saved_dataset(tmp_path, shard)))
    assert caught.value.code == "compression_bomb"
    assert "max_compression_ratio" in caught.value.message and caught.value.field == "data-00000-of-00001.arrow"
    assert pa.total_allocated_bytes() - pool_before < 1 * MIB  # nothing was decompressed


def test_one_batch_over_max_batch_bytes_is_refused(tmp_path: Path) -> None:
    shard = zstd_arrow_shard(8 * MIB)
    with pytest.raises(DataIssue) as caught:
        list(iter_rows(_saved_dataset(tmp_path, shard), limits=ReadLimits(max_batch_bytes=4 * MIB,
                                                                       max_compression_ratio=1e9)))
    assert caught.value.code == "compression_bomb" and "max_batch_bytes" in caught.value.message


def test_the_bomb_in_a_tar_gz_archive_is_refused(tmp_path: Path) -> None:
    archive = tmp_path / "bomb.tar.gz"
    archive.write_bytes(saved_dataset_tar(zstd_arrow_shard(64 * MIB)))
    assert archive.stat().st_size < 20_000
    with pytest.raises(DataIssue) as caught:
        list(iter_rows(archive))
    assert caught.value.code == "compression_bomb"


def test_a_parquet_row_group_over_max_batch_bytes_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "big.parquet"
    pq.write_table(pa.table({"text": ["a" * 1024] * 4096}), path, compression="zstd", row_group_size=4096,
                   use_dictionary=False)
    with pytest.raises(DataIssue) as caught:
        list(iter_rows(path, limits=ReadLimits(max_batch_bytes=1 * MIB, max_compression_ratio=1e9)))
    assert caught.value.code == "compression_bomb" and "max_batch_bytes" in caught.value.message


def test_a_parquet_bomb_is_refused_by_ratio(tmp_path: Path) -> None:
    path = tmp_path / "bomb.parquet"
    pq.write_table(pa.table({"text": ["a" * 65536] * 512}), path, compression="zstd", use_dictionary=False)
    with pytest.raises(DataIssue) as caught:
        list(iter_rows(path))
    assert caught.value.code == "compression_bomb"


def test_a_corrupt_message_is_left_to_the_reader(tmp_path: Path) -> None:
    data = pa.py_buffer(b"\xff\xff\xff\xffgarbage")
    assert arrow_ipc.check_ipc_expansion(data, data.size, ReadLimits(), "shard") == 0
