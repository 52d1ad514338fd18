"""Every file of the corpus gets exactly the first error it should, on the line it should.

`tests/data/bad/EXPECTED.json` maps each broken file to the code and line of
its first error (plus `field`, the training `method` and reader `limits`
where they matter); `tests/data/good/EXPECTED.json` maps each valid dataset to
its kind and example count. Both directories are written by
`tests/data/make_bad_corpus.py`, which must reproduce the committed files.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from tuneforge import methods
from tuneforge.data.codes import CODES
from tuneforge.data.example import DataIssue
from tuneforge.data.limits import ReadLimits
from tuneforge.data.structure import StructureReport, validate_structure

DATA = Path(__file__).resolve().parents[2] / "data"
BAD = DATA / "bad"
GOOD = DATA / "good"
BAD_EXPECTED: dict[str, dict[str, Any]] = json.loads((BAD / "EXPECTED.json").read_text())
GOOD_EXPECTED: dict[str, dict[str, Any]] = json.loads((GOOD / "EXPECTED.json").read_text())


def check(path: Path, entry: dict[str, Any]) -> StructureReport:
    limits = ReadLimits(**entry.get("limits", {}))
    return validate_structure(path, method=methods.get(entry.get("method", "supervised")).fit, limits=limits)


def first_error(path: Path, method: str = "supervised", **limits: Any) -> DataIssue | None:
    return validate_structure(path, method=methods.get(method).fit, limits=ReadLimits(**limits)).first_error()


def test_the_corpus_is_large_and_fully_described() -> None:
    bad_files = {path.name for path in BAD.iterdir() if path.name != "EXPECTED.json"}
    good_files = {path.name for path in GOOD.iterdir() if path.name != "EXPECTED.json"}
    assert len(bad_files) >= 45
    assert len(good_files) >= 8
    assert bad_files == set(BAD_EXPECTED)
    assert good_files == set(GOOD_EXPECTED)


@pytest.mark.parametrize("name", sorted(BAD_EXPECTED))
def test_bad_file_gets_its_exact_first_error(name: str) -> None:
    entry = BAD_EXPECTED[name]
    report = check(BAD / name, entry)
    issue = report.first_error()
    assert issue is not None, f"{name} passed validation"
    assert (issue.code, issue.line) == (entry["code"], entry["line"]), issue
    if "field" in entry:
        assert issue.field == entry["field"]
    assert issue.code in CODES
    assert not report.ok


@pytest.mark.parametrize("name", sorted(GOOD_EXPECTED))
def test_good_file_parses_to_the_right_kind_and_count(name: str) -> None:
    entry = GOOD_EXPECTED[name]
    report = check(GOOD / name, entry)
    assert report.errors() == []
    assert report.ok
    assert (report.format, report.kind, report.num_examples) == (entry["format"], entry["kind"], entry["count"])
    assert report.num_rows == entry["count"]
    assert sorted(issue.code for issue in report.warnings()) == entry.get("warnings", [])


def test_every_code_in_the_corpus_is_documented() -> None:
    assert {entry["code"] for entry in BAD_EXPECTED.values()} <= set(CODES)


def test_first_error_helper_reads_defaults() -> None:
    issue = first_error(BAD / "gzip_bomb.jsonl.gz")
    assert issue is not None and issue.code == "compression_bomb"
    assert first_error(GOOD / "chat_basic.jsonl") is None


def test_generator_reproduces_the_committed_corpus(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("make_bad_corpus", DATA / "make_bad_corpus.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.build_corpus(tmp_path / "bad", tmp_path / "good")
    import pyarrow.parquet as pq

    writer = pq.ParquetFile(GOOD / "chat.parquet").metadata.created_by
    same_writer = writer == pq.ParquetFile(tmp_path / "good" / "chat.parquet").metadata.created_by
    for committed_dir in (BAD, GOOD):
        fresh_dir = tmp_path / committed_dir.name
        committed = sorted(p.relative_to(committed_dir) for p in committed_dir.rglob("*") if p.is_file())
        fresh = sorted(p.relative_to(fresh_dir) for p in fresh_dir.rglob("*") if p.is_file())
        assert committed == fresh
        for relative in committed:
            if ".parquet" in relative.name:  # Parquet footers name the writing pyarrow version: compare the rows
                old, new = _parquet_rows(committed_dir / relative), _parquet_rows(fresh_dir / relative)
                if isinstance(old, str) and not same_writer:
                    # a broken file's bytes are another pyarrow's page layout: both must stay unreadable
                    assert isinstance(new, str), relative
                    continue
                assert old == new, relative
                continue
            if relative.name.endswith(".tar.gz"):  # a saved HF dataset: its Arrow files are pyarrow's bytes too
                assert _archive(committed_dir / relative) == _archive(fresh_dir / relative), relative
                continue
            assert (committed_dir / relative).read_bytes() == (fresh_dir / relative).read_bytes(), relative


def _parquet_rows(path: Path) -> list[dict] | str:
    """The rows of a Parquet file (gzipped or not); for one that does not parse (the corpus holds
    broken ones on purpose), its bytes up to the footer's metadata."""
    import gzip
    import io

    import pyarrow.parquet as pq

    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    try:
        return pq.read_table(io.BytesIO(data)).to_pylist()
    except Exception:  # noqa: BLE001 - a deliberately broken file: compare what is not pyarrow's
        return repr(data[:64])


def _archive(path: Path) -> dict[str, object]:
    """A tar.gz's members by name: an Arrow stream as its rows, anything else as its bytes."""
    import io
    import tarfile

    import pyarrow as pa

    members: dict[str, object] = {}
    with tarfile.open(path, "r:gz") as archive:
        for member in archive.getmembers():
            handle = archive.extractfile(member)
            data = handle.read() if handle is not None else b""
            if member.name.endswith(".arrow"):
                members[member.name] = pa.ipc.open_stream(io.BytesIO(data)).read_all().to_pylist()
            else:
                members[member.name] = data
    return members
