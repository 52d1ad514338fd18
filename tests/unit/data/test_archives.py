"""Archive bounds: sparse and special members refused, zip methods limited,
the whole archive's expansion ratio counted."""

from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.helpers.bombs import saved_dataset_tar, sparse_tar
from tuneforge.data.archives import extract_dataset_archive
from tuneforge.data.example import DataIssue
from tuneforge.data.limits import MIB, ReadLimits


def _extract(tmp_path: Path, data: bytes, **limits: int) -> Path:
    archive = tmp_path / "upload.bin"
    archive.write_bytes(data)
    target = tmp_path / "out"
    target.mkdir()
    return extract_dataset_archive(archive, target, ReadLimits(**limits))


def _written_bytes(directory: Path) -> int:
    return sum(path.stat().st_size for path in directory.rglob("*") if path.is_file())


def test_a_sparse_member_is_refused_before_a_byte_is_written(tmp_path: Path) -> None:
    with pytest.raises(DataIssue) as caught:
        _extract(tmp_path, sparse_tar(2 * 1024**3))
    assert caught.value.code == "unsafe_archive"
    assert "sparse" in caught.value.message and caught.value.field == "ds/state.json"
    assert _written_bytes(tmp_path / "out") == 0


@pytest.mark.parametrize("member_type", [tarfile.FIFOTYPE, tarfile.CHRTYPE, tarfile.CONTTYPE, tarfile.SYMTYPE])
def test_members_other_than_files_and_folders_are_refused(tmp_path: Path, member_type: bytes) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        info = tarfile.TarInfo("ds/state.json")
        info.type = member_type
        archive.addfile(info)
    with pytest.raises(DataIssue) as caught:
        _extract(tmp_path, buffer.getvalue())
    assert caught.value.code == "unsafe_archive"


def test_zip_members_must_be_stored_or_deflated(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_BZIP2) as archive:
        archive.writestr("ds/state.json", b"{}" * 1000)
    with pytest.raises(DataIssue) as caught:
        _extract(tmp_path, buffer.getvalue())
    assert caught.value.code == "invalid_archive" and "stored and deflated" in caught.value.message


def test_many_small_members_add_up_to_the_archive_ratio(tmp_path: Path) -> None:
    # each member is under the per-member grace size; together they expand 1000x
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for index in range(12):
            archive.writestr(f"ds/part-{index}.txt", b"\0" * (512 * 1024))
    with pytest.raises(DataIssue) as caught:
        _extract(tmp_path, buffer.getvalue(), ratio_grace_bytes=1 * MIB, max_compression_ratio=100.0)
    assert caught.value.code == "compression_bomb" and "100x" in caught.value.message
    assert _written_bytes(tmp_path / "out") <= 2 * MIB + 1 * MIB  # stopped one chunk past the limit


def test_a_plain_saved_dataset_tar_still_extracts(tmp_path: Path) -> None:
    from tests.helpers.bombs import zstd_arrow_shard

    root = _extract(tmp_path, saved_dataset_tar(zstd_arrow_shard(64 * 1024), gzip=False))
    assert (root / "state.json").is_file() and (root / "data-00000-of-00001.arrow").is_file()
