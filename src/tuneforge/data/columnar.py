"""Columnar sources: Parquet files and saved Hugging Face datasets (Arrow IPC shards).

Both are read a batch of rows at a time, so memory stays bounded by
`ReadLimits.batch_rows` whatever the table's size. A compressed batch or row
group is decompressed whole, so what each will decode to is read from the file
first (the IPC messages' buffer sizes, `data.arrow_ipc`; the Parquet footer)
and held to `max_batch_bytes`, `max_decompressed_bytes` and
`max_compression_ratio`; the decoded bytes are also counted as batches arrive. A saved dataset is the
layout `datasets`' `save_to_disk` writes: `state.json` naming `data-*.arrow`
shards in Arrow IPC *stream* format (the IPC *file* format is read too), or a
`dataset_dict.json` whose `train` split (or only split) is used. Only pyarrow
is needed; `datasets` is never imported.

pyarrow is imported on first use so the trainer, which reads JSONL only,
does not pay for it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from tuneforge.data.arrow_ipc import check_ipc_expansion, check_total
from tuneforge.data.cells import JSON_COLUMNS, decode_cells, drop_nulls
from tuneforge.data.example import DataIssue
from tuneforge.data.limits import ReadLimits
from tuneforge.data.shapes import json_keys_all, known_keys_all, shape_help

Row = tuple[int, "dict[str, Any] | DataIssue"]
_MAX_METADATA_BYTES = 16 * 1024 * 1024  # state.json of even a many-shard dataset is far smaller


def usable_columns(names: list[str], string_columns: Iterable[str], what: str, line: int = 0) -> frozenset[str]:
    """Check a table's (or CSV header's) column names; return the text columns holding JSON."""
    seen: set[str] = set()
    for name in names:
        if not name.strip() or name in seen:
            problem = "an empty column name" if not name.strip() else f"column '{name}' twice"
            raise DataIssue("invalid_schema", f"the {what} has {problem}", line=line, field=name or None)
        seen.add(name)
    if not seen & known_keys_all():
        expected = "; ".join(shape_help().values())
        raise DataIssue(
            "invalid_schema",
            f"the {what} has no usable column; found: {', '.join(names) or 'none'}. Expected the columns of "
            f"one of: {expected}",
            line=line,
        )
    json_columns = json_keys_all(JSON_COLUMNS)
    return frozenset(name for name in string_columns if name in json_columns)


def iter_parquet_rows(path: Path, limits: ReadLimits) -> Iterator[Row]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
        schema = parquet.schema_arrow
    except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:  # the last: a corrupt footer's names
        raise DataIssue("invalid_parquet", f"not a readable Parquet file ({exc})") from None
    with parquet:
        json_columns = usable_columns(schema.names, _string_columns(schema), "Parquet file")
        if parquet.metadata.num_rows == 0:
            raise DataIssue("empty_file", "the Parquet file has no rows")
        _check_expansion(parquet.metadata, path.stat().st_size, limits)
        batches = parquet.iter_batches(batch_size=limits.batch_rows)
        yield from _rows(batches, json_columns, 0, limits, "invalid_parquet", "the Parquet file",
                         path.stat().st_size)


def iter_hf_dataset_rows(directory: Path, limits: ReadLimits) -> Iterator[Row]:
    import pyarrow as pa

    root = _split_directory(directory)
    row = 0
    json_columns: frozenset[str] | None = None
    decoded_bytes = stored_bytes = 0
    for shard in _shard_paths(root):
        try:
            with pa.memory_map(str(shard), "r") as source:
                # a zstd batch is decompressed whole when read: its declared size is checked first
                decoded_bytes += check_ipc_expansion(source.read_buffer(), source.size(), limits, shard.name)
                stored_bytes += source.size()
                check_total(decoded_bytes, stored_bytes, limits, "the saved dataset")
                source.seek(0)
                schema, batches = _open_arrow(source)
                if json_columns is None:
                    json_columns = usable_columns(schema.names, _string_columns(schema), "saved dataset")
                row = yield from _rows(batches, json_columns, row, limits, "invalid_arrow", shard.name,
                                       source.size())
        except (pa.ArrowException, OSError) as exc:
            raise DataIssue("invalid_arrow", f"cannot read {shard.name} ({exc})", line=row + 1) from None
    if row == 0:
        raise DataIssue("empty_file", "the saved dataset has no rows")


def _check_expansion(metadata: Any, file_bytes: int, limits: ReadLimits) -> None:
    """Refuse a Parquet bomb from its footer, before a page is decompressed.

    A row group is decompressed whole when read, so its declared size is what
    reading will cost; the footer states it for every row group, and each column
    chunk states its own (the larger of the two claims counts). A footer that
    lies is caught by the running count of decoded bytes (`_rows`).
    """
    sizes = [_row_group_bytes(metadata.row_group(index)) for index in range(metadata.num_row_groups)]
    if max(sizes, default=0) > limits.max_batch_bytes:
        raise DataIssue("compression_bomb", f"a row group of the Parquet file decodes to {max(sizes)} bytes, more "
                        f"than max_batch_bytes ({limits.max_batch_bytes})")
    total_bytes = sum(sizes)
    if total_bytes > limits.max_decompressed_bytes:
        raise DataIssue("compression_bomb", f"the Parquet file decompresses to {total_bytes} bytes, more than "
                        f"{limits.max_decompressed_bytes}")
    if total_bytes > limits.ratio_grace_bytes and total_bytes > limits.max_compression_ratio * file_bytes:
        raise DataIssue("compression_bomb", f"the Parquet file expands more than {limits.max_compression_ratio:g}x "
                        f"({file_bytes} bytes hold {total_bytes})")


def _row_group_bytes(row_group: Any) -> int:
    columns = sum(max(row_group.column(i).total_uncompressed_size, 0) for i in range(row_group.num_columns))
    return max(row_group.total_byte_size, columns)


def _string_columns(schema: Any) -> list[str]:
    import pyarrow as pa

    return [field.name for field in schema if pa.types.is_string(field.type) or pa.types.is_large_string(field.type)]


def _rows(
    batches: Iterable[Any], json_columns: frozenset[str], rows_before: int, limits: ReadLimits, code: str,
    where: str, stored_bytes: int,
) -> Iterator[Row]:
    """(line, record) for every row of `batches`; returns the last line number.

    The decoded bytes are counted batch by batch against the limits, whatever the
    metadata claimed, before a batch becomes Python objects."""
    import pyarrow as pa

    row = rows_before
    decoded_bytes = 0
    iterator = iter(batches)
    while True:
        try:
            batch = next(iterator)
        except StopIteration:
            return row
        except (pa.ArrowException, OSError) as exc:
            raise DataIssue(code, f"cannot read {where} from row {row + 1} ({exc})", line=row + 1) from None
        decoded_bytes += batch.nbytes
        check_total(decoded_bytes, stored_bytes, limits, where)
        for start in range(0, batch.num_rows, limits.batch_rows):
            for record in _records(batch.slice(start, limits.batch_rows), row):
                row += 1
                if isinstance(record, DataIssue):
                    yield row, record
                    continue
                # Arrow marks a struct field a message lacks as null; absent and null are one thing.
                yield row, decode_cells(drop_nulls(record), row, json_columns)


def _records(batch: Any, rows_before: int) -> list[dict[str, Any] | DataIssue]:
    """The rows of `batch` as dicts; a row whose strings are not UTF-8 becomes its issue.

    Arrow does not check that string columns hold UTF-8; Python does when it
    converts them, and then fails the whole batch. Only then is the batch
    converted row by row, to name the bad rows.
    """
    try:
        return batch.to_pylist()
    except UnicodeDecodeError:
        pass
    records: list[dict[str, Any] | DataIssue] = []
    for offset in range(batch.num_rows):
        try:
            records.append(batch.slice(offset, 1).to_pylist()[0])
        except UnicodeDecodeError as exc:
            records.append(DataIssue("invalid_encoding", f"a string is not valid UTF-8 ({exc.reason})",
                                     line=rows_before + offset + 1))
    return records


def _open_arrow(source: Any) -> tuple[Any, Iterable[Any]]:
    """The schema and record batches of one shard, in IPC stream or file format."""
    import pyarrow as pa

    try:
        reader = pa.ipc.open_stream(source)
        return reader.schema, reader
    except pa.ArrowInvalid:
        source.seek(0)
    reader = pa.ipc.open_file(source)
    return reader.schema, (reader.get_batch(index) for index in range(reader.num_record_batches))


def _split_directory(directory: Path) -> Path:
    """The directory of the split to read: the dataset itself, or the `train` split of a DatasetDict."""
    index = directory / "dataset_dict.json"
    if not index.is_file():
        return directory
    splits = _read_metadata(index).get("splits")
    if not isinstance(splits, list) or not splits or not all(isinstance(name, str) for name in splits):
        raise DataIssue("invalid_hf_dataset", "dataset_dict.json has no list of 'splits'")
    if "train" in splits:
        split = "train"
    elif len(splits) == 1:
        split = splits[0]
    else:
        raise DataIssue("invalid_hf_dataset", f"the dataset has splits {', '.join(splits)} and none is "
                        "called 'train'; save the split to train on")
    return directory / _plain_name(split, "dataset_dict.json")


def _shard_paths(root: Path) -> list[Path]:
    state = root / "state.json"
    if state.is_file():
        files = _read_metadata(state).get("_data_files")
        if not isinstance(files, list) or not all(
            isinstance(item, dict) and isinstance(item.get("filename"), str) for item in files
        ):
            raise DataIssue("invalid_hf_dataset", "state.json has no list of '_data_files'")
        paths = [root / _plain_name(item["filename"], "state.json") for item in files]
    else:
        paths = sorted(root.glob("data-*.arrow"))
    if not paths:
        raise DataIssue("invalid_hf_dataset", f"no data files in {root.name or root}: expected state.json "
                        "naming data-*.arrow shards (datasets' save_to_disk layout)")
    missing = [path.name for path in paths if not path.is_file()]
    if missing:
        raise DataIssue("invalid_hf_dataset", f"data files listed in state.json are missing: {', '.join(missing)}")
    return paths


def _plain_name(name: str, source: str) -> str:
    """A file or folder name from metadata, refusing anything that would leave the dataset folder."""
    if not name or name in (".", "..") or "/" in name or "\\" in name:
        raise DataIssue("invalid_hf_dataset", f"{source} names {name!r}, which is not a plain name inside the "
                        "dataset folder")
    return name


def _read_metadata(path: Path) -> dict[str, Any]:
    if path.stat().st_size > _MAX_METADATA_BYTES:
        raise DataIssue("invalid_hf_dataset", f"{path.name} is larger than {_MAX_METADATA_BYTES} bytes")
    try:
        value = json.loads(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataIssue("invalid_hf_dataset", f"{path.name} is not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise DataIssue("invalid_hf_dataset", f"{path.name} must hold a JSON object")
    return value
