"""Read any supported dataset source as a stream of rows, in bounded memory.

Formats:

- `jsonl`: one JSON object per line; `.jsonl.gz` (gzip) too. UTF-8, a leading
  byte-order mark is dropped.
- `csv`: a header row, then one record per row. Cells of structured columns
  (`messages`, `tools`, `input`, `preferred_output`, ...) hold JSON and are
  decoded; `chosen`/`rejected` are decoded when they hold a message; every
  other column (`prompt`, `completion`, `text`) stays a string. `.csv.gz` too.
- `parquet`: read one batch of rows at a time.
- `hf_dataset`: a saved Hugging Face dataset (`save_to_disk` layout), as a
  directory or as an uploaded `.tar`, `.tar.gz` or `.zip` of one, which is
  extracted safely to a temporary directory first.

`iter_rows` yields `(line, record)` for a good row and `(line, DataIssue)` for
a broken one, so a check can carry on and report many errors in one pass.
Problems with the file as a whole (empty, binary, corrupt, a compression
bomb, an unsafe archive, a line past the limit) are raised as `DataIssue`.
Line numbers are 1-based: the JSONL line, the line where a CSV record starts
(the header is line 1), the Parquet/Arrow row + 1.
"""

from __future__ import annotations

import csv
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from tuneforge.data.archives import extract_dataset_archive, is_tar, is_zip
from tuneforge.data.cells import JSONDecodeError, decode_cells, loads
from tuneforge.data.columnar import Row, iter_hf_dataset_rows, iter_parquet_rows, usable_columns
from tuneforge.data.compression import GZIP_MAGIC, GuardedGunzip, gunzip_head
from tuneforge.data.example import DataIssue, excerpt_of
from tuneforge.data.limits import DEFAULT_LIMITS, ReadLimits
from tuneforge.domain.vocab import DATA_FORMATS

__all__ = ["ReadLimits", "Row", "check_text", "detect_format", "iter_csv_stream", "iter_jsonl_stream",
           "iter_rows", "parse_jsonl_line", "resolve_format", "split_lines"]

HEAD_BYTES = 64 * 1024
_CHUNK_BYTES = 1024 * 1024
_UTF8_BOM = b"\xef\xbb\xbf"
_PARQUET_MAGIC = b"PAR1"
_EXTENSIONS = (
    (".jsonl", "jsonl"), (".ndjson", "jsonl"), (".json", "jsonl"), (".csv", "csv"),
    (".parquet", "parquet"), (".pq", "parquet"), (".tar", "hf_dataset"), (".tgz", "hf_dataset"),
    (".zip", "hf_dataset"),
)
# Bytes that never occur in text, apart from tab, newlines, form feed and escape.
_CONTROL_BYTES = bytes(set(range(32)) - {9, 10, 12, 13, 27})
_NOT_CONTROL = bytes(set(range(256)) - set(_CONTROL_BYTES))
_MAX_CONTROL_FRACTION = 0.05


def detect_format(name: str, head: bytes) -> str:
    """The format of a file called `name` whose first bytes are `head`.

    Magic bytes decide first (Parquet, zip, tar, gzip — whose content is then
    looked at), then the extension, then the content itself. Raises
    `DataIssue` (`binary_file`, `invalid_encoding`, `unsupported_format`)
    when none of them tells.
    """
    if head.startswith(_PARQUET_MAGIC):
        return "parquet"
    if is_zip(head) or is_tar(head):
        return "hf_dataset"
    lowered = name.lower()
    if head.startswith(GZIP_MAGIC):
        inner = gunzip_head(head, HEAD_BYTES)
        if is_tar(inner):
            return "hf_dataset"
        if inner.startswith(_PARQUET_MAGIC):
            raise DataIssue("unsupported_format", "gzip-compressed Parquet is not supported; Parquet compresses "
                            "its own pages, upload the .parquet file as it is")
        return _detect_text(lowered.removesuffix(".gz").removesuffix(".gzip"), inner)
    return _detect_text(lowered, head)


def _detect_text(lowered_name: str, head: bytes) -> str:
    for suffix, fmt in _EXTENSIONS:
        if lowered_name.endswith(suffix):
            return fmt
    check_text(head)
    text = head.removeprefix(_UTF8_BOM).lstrip()
    if text.startswith(b"{"):
        return "jsonl"
    if b"," in text.split(b"\n", 1)[0]:
        return "csv"
    raise DataIssue("unsupported_format", "cannot tell the file's format: name it .jsonl, .csv, .parquet, "
                    ".tar.gz or .zip, or pass the format explicitly")


def check_text(head: bytes) -> None:
    """Raise unless `head` can be the start of a UTF-8 text file."""
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise DataIssue("invalid_encoding", "the file is UTF-16; save it as UTF-8")
    if b"\x00" in head:
        raise DataIssue("binary_file", "the file holds binary data (NUL bytes), not UTF-8 text")
    control_bytes = len(head.translate(None, _NOT_CONTROL))
    if control_bytes > _MAX_CONTROL_FRACTION * len(head):
        raise DataIssue("binary_file", f"the file holds binary data ({control_bytes} control bytes in the first "
                        f"{len(head)}), not UTF-8 text")


def resolve_format(path: Path, fmt: str | None = None, *, name: str | None = None) -> str:
    """The format to read `path` as: `fmt` when given (checked), else detected.

    `name` is the file's original name when `path` is a temporary copy.
    Raises `empty_file` for a file of 0 bytes.
    """
    path = Path(path)
    if fmt is not None and fmt not in DATA_FORMATS:
        raise DataIssue("unsupported_format", f"unknown format {fmt!r}; use one of {', '.join(DATA_FORMATS)}")
    if path.is_dir():
        if fmt not in (None, "hf_dataset"):
            raise DataIssue("unsupported_format", f"a directory can only be read as hf_dataset, not {fmt}")
        return "hf_dataset"
    if path.stat().st_size == 0:
        raise DataIssue("empty_file", "the file is empty")
    if fmt is not None:
        return fmt
    with open(path, "rb") as handle:
        head = handle.read(HEAD_BYTES)
    return detect_format(name or path.name, head)


def iter_rows(
    path: Path, fmt: str | None = None, *, limits: ReadLimits = DEFAULT_LIMITS, name: str | None = None,
) -> Iterator[Row]:
    """(line, record or DataIssue) for every row of the dataset at `path`; see the module docs."""
    path = Path(path)
    fmt = resolve_format(path, fmt, name=name)
    if fmt == "hf_dataset":
        if path.is_dir():
            yield from iter_hf_dataset_rows(path, limits)
            return
        with tempfile.TemporaryDirectory(prefix="tuneforge-dataset-") as scratch:
            yield from iter_hf_dataset_rows(extract_dataset_archive(path, Path(scratch), limits), limits)
        return
    if fmt == "parquet":
        yield from iter_parquet_rows(path, limits)
        return
    with open(path, "rb") as raw:
        compressed = raw.read(len(GZIP_MAGIC)) == GZIP_MAGIC
        raw.seek(0)
        stream: Any = GuardedGunzip(raw, limits) if compressed else raw
        if fmt == "jsonl":
            yield from iter_jsonl_stream(stream, limits)
        else:
            yield from iter_csv_stream(stream, limits)


# --- lines ----------------------------------------------------------------------


def split_lines(stream: IO[bytes], limits: ReadLimits = DEFAULT_LIMITS) -> Iterator[tuple[int, bytes]]:
    """(line number, bytes without the newline) for every line of a text stream.

    Reads fixed-size chunks, so no line can take more than `max_line_bytes`
    of memory (`line_too_long`). Checks the start is text and drops a BOM.
    """
    line = 0
    tail = b""
    chunk = stream.read(_CHUNK_BYTES)
    if chunk.startswith(_UTF8_BOM):
        # A stream may return the BOM alone; an empty chunk here must not end the file.
        chunk = chunk[len(_UTF8_BOM):] or stream.read(_CHUNK_BYTES)
    check_text(chunk[:HEAD_BYTES])
    while chunk:
        if tail:
            chunk = tail + chunk
        pieces = chunk.split(b"\n")
        tail = pieces.pop()
        for raw in pieces:
            line += 1
            if len(raw) > limits.max_line_bytes:
                raise _too_long(line, limits)
            yield line, raw
        if len(tail) > limits.max_line_bytes:
            raise _too_long(line + 1, limits)
        chunk = stream.read(_CHUNK_BYTES)
    if tail:
        yield line + 1, tail


def _too_long(line: int, limits: ReadLimits) -> DataIssue:
    return DataIssue("line_too_long", f"the line is longer than {limits.max_line_bytes} bytes", line=line)


# --- JSONL ----------------------------------------------------------------------


def iter_jsonl_stream(stream: IO[bytes], limits: ReadLimits = DEFAULT_LIMITS) -> Iterator[Row]:
    """(line, record or DataIssue) for every non-blank line of a JSONL byte stream."""
    rows = 0
    for line, raw in split_lines(stream, limits):
        if not raw or raw.isspace():
            continue
        rows += 1
        yield line, parse_jsonl_line(raw, line)
    if not rows:
        raise DataIssue("empty_file", "the file holds only blank lines")


def parse_jsonl_line(raw: bytes, line: int) -> dict[str, Any] | DataIssue:
    """One JSONL line as an object, or the issue saying why it is not one."""
    try:
        value = loads(raw)
    except (JSONDecodeError, UnicodeDecodeError) as exc:  # the second from the json fallback
        return _json_issue(raw, line, exc)
    if type(value) is dict:
        return value
    hint = "; a JSON array is not JSONL: write one object per line" if type(value) is list else ""
    return DataIssue("invalid_type", f"expected a JSON object, got {type(value).__name__}{hint}", line=line,
                     excerpt=excerpt_of(raw.decode("utf-8", "replace")))


def _json_issue(raw: bytes, line: int, exc: JSONDecodeError | UnicodeDecodeError) -> DataIssue:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as bad:
        around = raw[max(0, bad.start - 40):bad.start + 40].decode("utf-8", "replace")
        return DataIssue("invalid_encoding", f"not valid UTF-8 at byte {bad.start + 1} of the line ({bad.reason})",
                         line=line, excerpt=around)
    column = max(getattr(exc, "colno", 1), 1)
    reason = getattr(exc, "msg", str(exc))
    hint = ""
    if text.strip() in ("{", "["):
        hint = "; each line must hold one whole JSON object (pretty-printed JSON is not JSONL)"
    return DataIssue("invalid_json", f"not valid JSON: {reason} at column {column}{hint}", line=line,
                     excerpt=excerpt_of(text[max(0, column - 60):column + 40]))


# --- CSV ------------------------------------------------------------------------


class _DecodedLines:
    """Physical lines as text for `csv.reader`, remembering where each record starts.

    Decoding here, line by line, is what lets a bad byte be reported on its own
    line; an undecodable line is passed on with replacement characters and the
    first one is kept for the record it belongs to.
    """

    def __init__(self, lines: Iterator[tuple[int, bytes]]) -> None:
        self._lines = lines
        self.count = 0
        self.bad_line = 0
        self.bad_reason = ""

    def __iter__(self) -> _DecodedLines:
        return self

    def __next__(self) -> str:
        number, raw = next(self._lines)
        self.count = number
        try:
            return raw.decode("utf-8") + "\n"
        except UnicodeDecodeError as exc:
            if not self.bad_line:
                self.bad_line, self.bad_reason = number, f"not valid UTF-8 at byte {exc.start + 1} ({exc.reason})"
            return raw.decode("utf-8", "replace") + "\n"

    def take_bad(self) -> DataIssue | None:
        if not self.bad_line:
            return None
        issue = DataIssue("invalid_encoding", self.bad_reason, line=self.bad_line)
        self.bad_line = 0
        return issue


def iter_csv_stream(stream: IO[bytes], limits: ReadLimits = DEFAULT_LIMITS) -> Iterator[Row]:
    """(line, record or DataIssue) for every record of a CSV byte stream with a header row."""
    # csv's field limit is process-wide; raising it to our own line cap only loosens it.
    csv.field_size_limit(max(csv.field_size_limit(), limits.max_line_bytes))
    lines = _DecodedLines(split_lines(stream, limits))
    reader = csv.reader(lines, strict=True)
    names, header_line = _csv_header(reader, lines)
    json_columns = usable_columns(names, names, "CSV header", line=header_line)
    records = 0
    while True:
        start = lines.count + 1
        try:
            cells = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            lines.take_bad()
            records += 1
            yield start, DataIssue("csv_syntax", f"CSV quoting error: {exc}", line=start)
            continue
        if not cells or (len(cells) == 1 and not cells[0].strip()):
            continue
        records += 1
        yield start, _csv_record(cells, names, start, lines, json_columns)
    if not records:
        raise DataIssue("empty_file", "the CSV file has a header but no records")


def _csv_header(reader: Any, lines: _DecodedLines) -> tuple[list[str], int]:
    while True:
        start = lines.count + 1
        try:
            cells = next(reader)
        except StopIteration:
            raise DataIssue("empty_file", "the CSV file holds only blank lines") from None
        except csv.Error as exc:
            raise DataIssue("csv_syntax", f"CSV quoting error in the header: {exc}", line=start) from None
        bad = lines.take_bad()
        if bad is not None:
            raise bad
        if cells and any(cell.strip() for cell in cells):
            return [cell.strip() for cell in cells], start


def _csv_record(
    cells: list[str], names: list[str], line: int, lines: _DecodedLines, json_columns: frozenset[str],
) -> dict[str, Any] | DataIssue:
    bad = lines.take_bad()
    if bad is not None:
        return bad
    if len(cells) != len(names):
        return DataIssue("csv_syntax", f"the record has {len(cells)} cells but the header has {len(names)} "
                         "columns", line=line, excerpt=excerpt_of(",".join(cells)))
    return decode_cells(dict(zip(names, cells, strict=True)), line, json_columns)
