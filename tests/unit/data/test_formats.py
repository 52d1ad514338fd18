"""formats: detection, streaming rows of every format, and the exact issue of each broken file."""

from __future__ import annotations

import gzip
import io
import json
import random
import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tuneforge.data.example import DataIssue
from tuneforge.data.formats import detect_format, iter_jsonl_stream, iter_rows, resolve_format
from tuneforge.data.limits import MIB, ReadLimits

CHAT = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}


def rows_of(path: Path, fmt: str | None = None, **limits: Any) -> list[tuple[int, Any]]:
    return list(iter_rows(path, fmt, limits=ReadLimits(**limits)))


def file_issue(path: Path, fmt: str | None = None, **limits: Any) -> DataIssue:
    with pytest.raises(DataIssue) as caught:
        rows_of(path, fmt, **limits)
    return caught.value


def write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def gz(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


def jsonl(*rows: Any) -> bytes:
    return b"".join(json.dumps(row).encode() + b"\n" for row in rows)


def parquet(tmp_path: Path, name: str, table: pa.Table, row_group_rows: int = 1024) -> Path:
    path = tmp_path / name
    pq.write_table(table, path, row_group_size=row_group_rows)
    return path


# --- detection ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "head", "fmt"),
    [
        ("data.jsonl", b"PAR1\x15\x04", "parquet"),  # magic beats the extension
        ("upload.bin", b"PK\x03\x04rest", "hf_dataset"),
        ("upload", b"\0" * 257 + b"ustar\x0000", "hf_dataset"),
        ("train.jsonl.gz", gz(b'{"text": "a"}\n'), "jsonl"),
        ("train.csv.gz", gz(b"prompt,completion\n"), "csv"),
        ("data.tgz", gz(b"\0" * 257 + b"ustar\x0000" + b"\0" * 200), "hf_dataset"),
        ("upload", gz(b'{"text": "a"}\n'), "jsonl"),
        ("train.ndjson", b'{"text": "a"}', "jsonl"),
        ("train.JSON", b'{"text": "a"}', "jsonl"),
        ("train.csv", b'{"text": "a"}', "csv"),  # the extension beats sniffing
        ("data.parquet", b"not parquet at all", "parquet"),
        ("upload", b'\xef\xbb\xbf  {"text": "a"}', "jsonl"),
        ("upload", b"prompt,completion\nhi,there\n", "csv"),
    ],
)
def test_detect_format(name: str, head: bytes, fmt: str) -> None:
    assert detect_format(name, head) == fmt


@pytest.mark.parametrize(
    ("name", "head", "code"),
    [
        ("upload", b"\x00\x01\x02garbage", "binary_file"),
        ("upload", bytes(range(1, 9)) * 40, "binary_file"),
        ("upload", "{}".encode("utf-16"), "invalid_encoding"),
        ("notes.txt", b"just some words\n", "unsupported_format"),
        ("data.parquet.gz", gz(b"PAR1\x15\x04"), "unsupported_format"),
        ("data.jsonl.gz", b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03\xff\xff\xff", "invalid_compression"),
    ],
)
def test_detect_format_refuses(name: str, head: bytes, code: str) -> None:
    with pytest.raises(DataIssue) as caught:
        detect_format(name, head)
    assert (caught.value.code, caught.value.line) == (code, 0)


def test_explicit_format_overrides_detection(tmp_path: Path) -> None:
    path = write(tmp_path, "export.txt", b"prompt,completion\nhi,there\n")
    assert rows_of(path, "csv") == [(2, {"prompt": "hi", "completion": "there"})]
    assert resolve_format(path, "csv") == "csv"
    assert file_issue(path, "yaml").code == "unsupported_format"
    assert file_issue(tmp_path, "jsonl").code == "unsupported_format"


def test_original_name_drives_detection_of_a_temporary_copy(tmp_path: Path) -> None:
    path = write(tmp_path, "tmp-upload-1234", b"prompt\nhi\n")
    assert resolve_format(path, name="train.csv") == "csv"
    assert list(iter_rows(path, name="train.csv")) == [(2, {"prompt": "hi"})]


def test_limits_defaults() -> None:
    limits = ReadLimits()
    assert limits.max_line_bytes == 8 * MIB
    assert limits.max_compression_ratio == 100


# --- JSONL -------------------------------------------------------------------------


def test_jsonl_rows_carry_editor_line_numbers(tmp_path: Path) -> None:
    path = write(tmp_path, "a.jsonl", b'\xef\xbb\xbf{"a": 1}\r\n\n   \n{"b": "\xc3\xa9"}\n{"c": 3}')
    assert rows_of(path) == [(1, {"a": 1}), (4, {"b": "é"}), (5, {"c": 3})]


def test_jsonl_bad_rows_are_reported_and_reading_continues(tmp_path: Path) -> None:
    path = write(tmp_path, "a.jsonl", b'{"a": 1}\n{"a": \n[1, 2]\n{"a": "caf\xe9"}\n{"a": 5}\n')
    rows = rows_of(path)
    assert [line for line, _ in rows] == [1, 2, 3, 4, 5]
    assert rows[0][1] == {"a": 1} and rows[4][1] == {"a": 5}
    issues = [item for _, item in rows[1:4]]
    assert [(issue.code, issue.line) for issue in issues] == [
        ("invalid_json", 2), ("invalid_type", 3), ("invalid_encoding", 4)]
    assert "at column 7" in issues[0].message
    assert issues[1].message.startswith("expected a JSON object, got list")
    assert "byte 11" in issues[2].message


def test_pretty_printed_json_gets_a_hint(tmp_path: Path) -> None:
    path = write(tmp_path, "a.json", json.dumps([CHAT], indent=2).encode())
    issue = rows_of(path)[0][1]
    assert (issue.code, issue.line) == ("invalid_json", 1)
    assert "pretty-printed JSON is not JSONL" in issue.message


def test_line_over_the_default_limit_is_refused_at_its_line(tmp_path: Path) -> None:
    huge = json.dumps({"text": "x" * (8 * MIB + 10)}).encode()
    path = write(tmp_path, "a.jsonl", jsonl(CHAT) + b"\n" + huge + b"\n" + jsonl(CHAT))
    reader = iter_rows(path)
    assert next(reader) == (1, CHAT)
    with pytest.raises(DataIssue) as caught:
        next(reader)
    assert (caught.value.code, caught.value.line) == ("line_too_long", 3)


def test_last_line_without_newline_over_the_limit(tmp_path: Path) -> None:
    path = write(tmp_path, "a.jsonl", jsonl(CHAT) + b'{"text": "' + b"y" * 5000)
    assert (file_issue(path, max_line_bytes=4096).code, file_issue(path, max_line_bytes=4096).line) == (
        "line_too_long", 2)


@pytest.mark.parametrize(("data", "code"), [(b"", "empty_file"), (b" \n\r\n\t\n", "empty_file"),
                                            (bytes(range(256)) * 4, "binary_file")])
def test_jsonl_file_level_issues(tmp_path: Path, data: bytes, code: str) -> None:
    issue = file_issue(write(tmp_path, "a.jsonl", data))
    assert (issue.code, issue.line) == (code, 0)


class CountingStream(io.BytesIO):
    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.reads = 0

    def read(self, size: int | None = -1) -> bytes:
        self.reads += 1
        return super().read(size)


class TrickleStream(io.BytesIO):
    """Returns at most a few bytes per read, as a network or decompressing stream may."""

    def read(self, size: int | None = -1) -> bytes:
        return super().read(3)


def test_jsonl_from_a_stream_of_short_reads() -> None:
    rows = list(iter_jsonl_stream(TrickleStream(b'\xef\xbb\xbf{"a": 1}\n\n{"b": 2}')))
    assert rows == [(1, {"a": 1}), (3, {"b": 2})]


def test_jsonl_is_read_in_bounded_chunks_not_whole() -> None:
    stream = CountingStream(jsonl(*[CHAT] * 100_000))  # ~8 MB
    reader = iter_jsonl_stream(stream)
    assert next(reader) == (1, CHAT)
    assert stream.reads == 1 and stream.tell() <= MIB


# --- gzip --------------------------------------------------------------------------


def test_gzip_jsonl_and_multi_member_gzip(tmp_path: Path) -> None:
    path = write(tmp_path, "a.jsonl.gz", gz(jsonl(CHAT)) + gz(jsonl({"text": "b"})) + b"\0\0")
    assert rows_of(path) == [(1, CHAT), (2, {"text": "b"})]


def test_gzip_csv(tmp_path: Path) -> None:
    path = write(tmp_path, "a.csv.gz", gz(b"text\nhello\n"))
    assert rows_of(path) == [(2, {"text": "hello"})]


def test_gzip_over_the_absolute_cap_is_a_bomb(tmp_path: Path) -> None:
    path = write(tmp_path, "a.jsonl.gz", gz(jsonl(*[CHAT] * 2000)))
    issue = file_issue(path, max_decompressed_bytes=10_000, ratio_grace_bytes=10**9)
    assert (issue.code, issue.line) == ("compression_bomb", 0)
    assert "more than 10000 bytes" in issue.message


def test_gzip_over_the_ratio_cap_is_a_bomb(tmp_path: Path) -> None:
    path = write(tmp_path, "a.jsonl.gz", gz(b" " * (2 * MIB) + jsonl(CHAT)))
    assert file_issue(path, ratio_grace_bytes=MIB).code == "compression_bomb"
    assert rows_of(path, ratio_grace_bytes=4 * MIB) == [(1, CHAT)]  # small enough to be harmless


def test_truncated_gzip(tmp_path: Path) -> None:
    data = gz(jsonl(*[{"text": str(n) * 50} for n in range(3000)]))
    issue = file_issue(write(tmp_path, "a.jsonl.gz", data[: len(data) // 2]))
    assert issue.code == "invalid_compression"


# --- CSV ---------------------------------------------------------------------------


def test_csv_structured_cells_are_decoded_and_text_cells_stay_text(tmp_path: Path) -> None:
    messages = json.dumps(CHAT["messages"]).replace('"', '""')
    data = f'messages,tools,prompt\n"{messages}",,"[1, 2]"\n'.encode()
    assert rows_of(write(tmp_path, "a.csv", data)) == [(2, {**CHAT, "prompt": "[1, 2]"})]


def test_csv_chosen_is_decoded_only_when_it_is_a_message(tmp_path: Path) -> None:
    message = '{""role"": ""assistant"", ""content"": ""Hi""}'
    data = f'prompt,chosen,rejected\nq,"{message}","{{""answer"": 1}}"\n'.encode()
    [(_line, record)] = rows_of(write(tmp_path, "a.csv", data))
    assert record["chosen"] == {"role": "assistant", "content": "Hi"}
    assert record["rejected"] == '{"answer": 1}'


def test_csv_lines_are_where_records_start(tmp_path: Path) -> None:
    data = b'\n\nprompt,completion\n"multi\nline",a\n\nb,"c\n\nd"\ne,f\n'
    rows = rows_of(write(tmp_path, "a.csv", data))
    assert [line for line, _ in rows] == [4, 7, 10]
    assert rows[1][1] == {"prompt": "b", "completion": "c\n\nd"}


def test_csv_quoting_error_is_reported_and_reading_continues(tmp_path: Path) -> None:
    data = b'prompt,completion\n"a"b,c\nd,e\nf\n'
    rows = rows_of(write(tmp_path, "a.csv", data))
    assert [(line, getattr(item, "code", None)) for line, item in rows] == [
        (2, "csv_syntax"), (3, None), (4, "csv_syntax")]
    assert rows[1][1] == {"prompt": "d", "completion": "e"}


def test_csv_bad_json_cell_names_its_column(tmp_path: Path) -> None:
    issue = rows_of(write(tmp_path, "a.csv", b'messages\n"[{""role"": 1"\n'))[0][1]
    assert (issue.code, issue.line, issue.field) == ("invalid_json", 2, "messages")


def test_csv_encoding_error_names_the_physical_line(tmp_path: Path) -> None:
    data = b'prompt,completion\n"one\ncaf\xe9",x\ny,z\n'
    rows = rows_of(write(tmp_path, "a.csv", data))
    assert (rows[0][1].code, rows[0][1].line) == ("invalid_encoding", 3)
    assert rows[1] == (4, {"prompt": "y", "completion": "z"})


@pytest.mark.parametrize(
    ("data", "code", "line"),
    [
        (b"question,answer\na,b\n", "invalid_schema", 1),
        (b"\nprompt,,completion\na,b,c\n", "invalid_schema", 2),
        (b"prompt,completion\n", "empty_file", 0),
        (b'"prompt,completion\n', "csv_syntax", 1),
    ],
)
def test_csv_file_level_issues(tmp_path: Path, data: bytes, code: str, line: int) -> None:
    issue = file_issue(write(tmp_path, "a.csv", data))
    assert (issue.code, issue.line) == (code, line)


# --- Parquet -----------------------------------------------------------------------


def test_parquet_rows_over_row_groups_with_nulls_dropped(tmp_path: Path) -> None:
    records = [CHAT, {"messages": [{"role": "user", "content": "Q"},
                                   {"role": "assistant", "content": "A", "weight": 1}]}] * 3
    path = parquet(tmp_path, "a.parquet", pa.Table.from_pylist(records), row_group_rows=2)
    rows = rows_of(path, batch_rows=1)
    assert [line for line, _ in rows] == [1, 2, 3, 4, 5, 6]
    assert rows[0][1] == CHAT  # no "weight": None on the messages that lack it
    assert rows[1][1]["messages"][1]["weight"] == 1


def test_parquet_string_columns_holding_json_are_decoded(tmp_path: Path) -> None:
    table = pa.table({"messages": [json.dumps(CHAT["messages"])], "tools": pa.array([None], pa.string())})
    assert rows_of(parquet(tmp_path, "a.parquet", table)) == [(1, CHAT)]


@pytest.mark.parametrize(
    ("table", "code"),
    [
        (pa.table({"question": ["a"], "answer": ["b"]}), "invalid_schema"),
        (pa.table({"text": pa.array([], pa.string())}), "empty_file"),
    ],
)
def test_parquet_file_level_issues(tmp_path: Path, table: pa.Table, code: str) -> None:
    issue = file_issue(parquet(tmp_path, "a.parquet", table))
    assert (issue.code, issue.line) == (code, 0)


def test_parquet_that_expands_too_far_is_refused_from_its_footer(tmp_path: Path) -> None:
    path = parquet(tmp_path, "a.parquet", pa.table({"text": ["x" * 1000 + str(n) for n in range(2000)]}))
    assert file_issue(path, max_decompressed_bytes=100_000).code == "compression_bomb"
    issue = file_issue(path, ratio_grace_bytes=1000, max_compression_ratio=2)
    assert (issue.code, issue.line) == ("compression_bomb", 0)
    assert len(rows_of(path)) == 2000


def test_parquet_row_with_invalid_utf8_is_named(tmp_path: Path) -> None:
    raw = pa.array([b"fine", b"caf\xe9", b"also fine"], pa.binary())
    unchecked = pa.Array.from_buffers(pa.string(), len(raw), raw.buffers())  # Arrow does not validate
    rows = rows_of(parquet(tmp_path, "a.parquet", pa.table({"text": unchecked})))
    assert rows[0] == (1, {"text": "fine"}) and rows[2] == (3, {"text": "also fine"})
    assert (rows[1][1].code, rows[1][1].line) == ("invalid_encoding", 2)


def test_truncated_parquet(tmp_path: Path) -> None:
    path = parquet(tmp_path, "a.parquet", pa.Table.from_pylist([CHAT] * 10))
    path.write_bytes(path.read_bytes()[:-100])
    assert file_issue(path).code == "invalid_parquet"


# --- saved Hugging Face datasets -------------------------------------------------------


def save_dataset(directory: Path, records: list[dict[str, Any]], shards: int = 2, ipc_file: bool = False,
                 state: bool = True) -> dict[str, bytes]:
    directory.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(records)
    size = -(-len(records) // shards)
    names = [f"data-{index:05d}-of-{shards:05d}.arrow" for index in range(shards)]
    for index, name in enumerate(names):
        part = table.slice(index * size, size)
        with pa.OSFile(str(directory / name), "wb") as sink:
            opener = pa.ipc.new_file if ipc_file else pa.ipc.new_stream
            with opener(sink, table.schema) as writer:
                writer.write_table(part, max_chunksize=1)
    if state:
        (directory / "state.json").write_text(json.dumps({"_data_files": [{"filename": n} for n in names]}))
    (directory / "dataset_info.json").write_text("{}")
    return {path.name: path.read_bytes() for path in directory.iterdir()}


def texts(count: int) -> list[dict[str, str]]:
    return [{"text": f"document {index}"} for index in range(count)]


@pytest.mark.parametrize("ipc_file", [False, True])
def test_saved_dataset_directory_rows_number_across_shards(tmp_path: Path, ipc_file: bool) -> None:
    save_dataset(tmp_path / "ds", texts(5), shards=2, ipc_file=ipc_file)
    assert rows_of(tmp_path / "ds") == [(n + 1, {"text": f"document {n}"}) for n in range(5)]


def test_saved_dataset_without_state_json_reads_its_shards_in_order(tmp_path: Path) -> None:
    save_dataset(tmp_path / "ds", texts(4), shards=2, state=False)
    assert [record["text"] for _, record in rows_of(tmp_path / "ds")] == [f"document {n}" for n in range(4)]


def test_dataset_dict_reads_the_train_split(tmp_path: Path) -> None:
    save_dataset(tmp_path / "dd" / "train", texts(3))
    save_dataset(tmp_path / "dd" / "test", texts(1))
    (tmp_path / "dd" / "dataset_dict.json").write_text('{"splits": ["train", "test"]}')
    assert len(rows_of(tmp_path / "dd")) == 3
    (tmp_path / "dd" / "dataset_dict.json").write_text('{"splits": ["validation", "test"]}')
    assert file_issue(tmp_path / "dd").code == "invalid_hf_dataset"


@pytest.mark.parametrize(
    "state",
    ['{"_data_files": [{"filename": "../data.arrow"}]}', '{"_data_files": "x"}', "not json",
     '{"_data_files": [{"filename": "missing.arrow"}]}'],
)
def test_bad_state_json(tmp_path: Path, state: str) -> None:
    save_dataset(tmp_path / "ds", texts(2))
    (tmp_path / "ds" / "state.json").write_text(state)
    issue = file_issue(tmp_path / "ds")
    assert (issue.code, issue.line) == ("invalid_hf_dataset", 0)


def test_corrupt_shard_names_the_row_where_reading_stopped(tmp_path: Path) -> None:
    save_dataset(tmp_path / "ds", texts(4), shards=2)
    (tmp_path / "ds" / "data-00001-of-00002.arrow").write_bytes(b"\xff\xff\xff\xffgarbage")
    reader = iter_rows(tmp_path / "ds")
    assert [next(reader)[0], next(reader)[0]] == [1, 2]
    with pytest.raises(DataIssue) as caught:
        next(reader)
    assert (caught.value.code, caught.value.line) == ("invalid_arrow", 3)


def test_dataset_without_usable_columns(tmp_path: Path) -> None:
    save_dataset(tmp_path / "ds", [{"question": "a"}])
    assert file_issue(tmp_path / "ds").code == "invalid_schema"


# --- archives --------------------------------------------------------------------------


def tar_of(members: dict[str, bytes], *, compress: bool, link: tuple[str, str, bytes] | None = None) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
        if link is not None:
            info = tarfile.TarInfo(link[0])
            info.type, info.linkname = link[2], link[1]
            archive.addfile(info)
    return gz(buffer.getvalue()) if compress else buffer.getvalue()


def zip_of(members: dict[str, bytes], symlink: str | None = None) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
        if symlink is not None:
            info = zipfile.ZipInfo(symlink)
            info.external_attr = (0o120777 << 16)
            archive.writestr(info, "/etc/passwd")
    return buffer.getvalue()


@pytest.fixture
def dataset_files(tmp_path: Path) -> dict[str, bytes]:
    return save_dataset(tmp_path / "source", texts(3))


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where archives are extracted: checked empty once reading ends."""
    directory = tmp_path / "scratch"
    directory.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(directory))
    return directory


@pytest.mark.parametrize("compress", [False, True])
def test_tar_archive_of_a_saved_dataset(tmp_path: Path, dataset_files: dict[str, bytes], scratch: Path,
                                        compress: bool) -> None:
    members = {f"my_data/{name}": data for name, data in dataset_files.items()}
    members["__MACOSX/my_data/._state.json"] = b"\0junk"
    path = write(tmp_path, "data.tar.gz" if compress else "data.tar", tar_of(members, compress=compress))
    assert [line for line, _ in rows_of(path)] == [1, 2, 3]
    assert list(scratch.iterdir()) == []  # the extraction is cleaned up


def test_zip_archive_of_a_saved_dataset(tmp_path: Path, dataset_files: dict[str, bytes], scratch: Path) -> None:
    path = write(tmp_path, "data.zip", zip_of(dataset_files))
    assert len(rows_of(path)) == 3
    assert list(scratch.iterdir()) == []


@pytest.mark.parametrize(
    ("member", "link"),
    [
        ("../escape.txt", None),
        ("ok/../../escape.txt", None),
        ("/tmp/escape.txt", None),
        ("C:/escape.txt", None),
        ("dir\\..\\escape.txt", None),
        ("state.json", ("data", "/etc", tarfile.SYMTYPE)),
        ("state.json", ("data", "/etc/passwd", tarfile.LNKTYPE)),
        ("state.json", ("dev", "", tarfile.CHRTYPE)),
    ],
)
def test_unsafe_tar_members_are_refused(tmp_path: Path, scratch: Path, member: str,
                                        link: tuple[str, str, bytes] | None) -> None:
    path = write(tmp_path, "data.tar", tar_of({member: b"owned"}, compress=False, link=link))
    issue = file_issue(path)
    assert (issue.code, issue.line) == ("unsafe_archive", 0)
    assert not (tmp_path / "escape.txt").exists()
    assert list(scratch.iterdir()) == []


def test_unsafe_zip_members_are_refused(tmp_path: Path, scratch: Path) -> None:
    assert file_issue(write(tmp_path, "a.zip", zip_of({"../escape.txt": b"x"}))).code == "unsafe_archive"
    assert file_issue(write(tmp_path, "b.zip", zip_of({"state.json": b"{}"}, symlink="data"))).code == (
        "unsafe_archive")
    assert not (tmp_path / "escape.txt").exists()


def test_archive_caps(tmp_path: Path, dataset_files: dict[str, bytes], scratch: Path) -> None:
    path = write(tmp_path, "data.tar", tar_of(dataset_files, compress=False))
    assert file_issue(path, max_archive_members=2).code == "invalid_archive"
    assert file_issue(path, max_decompressed_bytes=100).code == "compression_bomb"
    bomb = write(tmp_path, "bomb.tar.gz", tar_of({"state.json": bytes(8 * MIB)}, compress=True))
    assert file_issue(bomb).code == "compression_bomb"


def test_archive_that_is_not_a_dataset(tmp_path: Path, scratch: Path) -> None:
    path = write(tmp_path, "data.zip", zip_of({"a/readme.txt": b"hi", "b/readme.txt": b"hi"}))
    assert file_issue(path).code == "invalid_archive"


# --- robustness ----------------------------------------------------------------------------------


def test_corrupted_files_of_every_format_get_data_issues_never_crashes(tmp_path: Path) -> None:
    """Flip, cut and insert bytes in the good corpus: every outcome is rows or a DataIssue."""
    good = Path(__file__).resolve().parents[2] / "data" / "good"
    sources = sorted(p for p in good.iterdir() if p.is_file() and p.name != "EXPECTED.json")
    rng = random.Random(2024)
    for attempt in range(300):
        source = sources[attempt % len(sources)]
        data = bytearray(source.read_bytes())
        position = rng.randrange(len(data))
        if attempt % 3 == 0:
            data[position] ^= 1 + rng.randrange(255)
        elif attempt % 3 == 1:
            data = data[:position]
        else:
            data[position:position] = rng.randbytes(8)
        target = write(tmp_path, source.name, bytes(data))
        try:
            for _ in iter_rows(target):
                pass
        except DataIssue:
            pass
