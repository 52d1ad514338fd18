"""Safe extraction of an uploaded archive (.tar, .tar.gz, .zip) of a saved dataset.

An upload is hostile until proven otherwise. Nothing is extracted by the
archive libraries' own `extractall`: each member is checked and written by
hand, so that

- absolute paths, '..' components and backslashes are refused (`unsafe_archive`);
- links, devices, FIFOs and sparse members are refused (`unsafe_archive`), so
  nothing written can point outside the target directory and a member's bytes
  on disk are the bytes in the archive;
- zip members must be stored or deflated (`invalid_archive`): those two are
  decompressed a bounded chunk at a time;
- the bytes written are counted against `max_decompressed_bytes`, and
  compressed input against `max_compression_ratio`, per zip member and for the
  whole archive (`compression_bomb`), whatever sizes the headers claim;
- at most `max_archive_members` entries are read (`invalid_archive`).

macOS resource-fork clutter (`__MACOSX/`, `._*`) is skipped.
"""

from __future__ import annotations

import stat
import tarfile
import zipfile
import zlib
from pathlib import Path, PurePosixPath
from typing import IO

from tuneforge.data.compression import GZIP_MAGIC, GuardedGunzip
from tuneforge.data.example import DataIssue, excerpt_of
from tuneforge.data.limits import ReadLimits

ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")  # a member, or the end record of an empty zip
_TAR_MAGIC_OFFSET = 257
_COPY_CHUNK_BYTES = 1024 * 1024
# Regular files (old and POSIX spellings) and folders: no links, devices, FIFOs, GNU
# continuation or sparse types, whose bytes are not simply the member's data.
_TAR_PLAIN_TYPES = (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.DIRTYPE)
_ZIP_METHODS = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)
# Files a saved dataset (datasets' save_to_disk) has at its top level.
DATASET_MARKERS = ("state.json", "dataset_dict.json")


def is_tar(head: bytes) -> bool:
    return head[_TAR_MAGIC_OFFSET:_TAR_MAGIC_OFFSET + 5] == b"ustar"


def is_zip(head: bytes) -> bool:
    return head.startswith(ZIP_MAGICS)


def extract_dataset_archive(path: Path, target_dir: Path, limits: ReadLimits) -> Path:
    """Extract the archive at `path` into `target_dir`; return the saved dataset's directory in it."""
    with open(path, "rb") as raw:
        head = raw.read(_TAR_MAGIC_OFFSET + 8)
        raw.seek(0)
        archive_bytes = path.stat().st_size
        if is_zip(head):
            _extract_zip(raw, target_dir, limits, archive_bytes)
        elif head.startswith(GZIP_MAGIC):
            _extract_tar(GuardedGunzip(raw, limits), target_dir, limits, archive_bytes)
        elif is_tar(head):
            _extract_tar(raw, target_dir, limits, archive_bytes)
        else:
            raise DataIssue("invalid_archive", "not a tar, tar.gz or zip archive")
    return dataset_root(target_dir)


def dataset_root(extracted_dir: Path) -> Path:
    """The saved dataset in an extracted archive: at its top, or in its one top-level folder."""
    if any((extracted_dir / marker).is_file() for marker in DATASET_MARKERS):
        return extracted_dir
    children = [child for child in extracted_dir.iterdir() if child.is_dir()]
    if len(children) == 1 and any((children[0] / marker).is_file() for marker in DATASET_MARKERS):
        return children[0]
    raise DataIssue(
        "invalid_archive",
        "the archive holds no saved dataset: expected state.json or dataset_dict.json (from "
        "datasets' save_to_disk) at its top or in its one top-level folder",
    )


def safe_member_path(name: str) -> PurePosixPath | None:
    """The relative path to write a member to; None for clutter to skip; raises if unsafe."""
    if "\\" in name or name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise DataIssue("unsafe_archive", f"archive member {excerpt_of(name, 80)!r} has an absolute or "
                        "Windows path", field=name)
    parts = [part for part in PurePosixPath(name).parts if part not in ("", ".")]
    if ".." in parts:
        raise DataIssue("unsafe_archive", f"archive member {excerpt_of(name, 80)!r} points outside the "
                        "archive ('..')", field=name)
    if not parts or parts[0] == "__MACOSX" or parts[-1].startswith("._"):
        return None
    return PurePosixPath(*parts)


class _Budget:
    """Bytes written so far across the whole archive, against the limits."""

    def __init__(self, limits: ReadLimits, archive_bytes: int) -> None:
        self.limits = limits
        self.archive_bytes = archive_bytes
        self.written_bytes = 0
        self.members = 0

    def count_member(self) -> None:
        self.members += 1
        if self.members > self.limits.max_archive_members:
            raise DataIssue("invalid_archive", f"the archive has more than {self.limits.max_archive_members} entries")

    def copy(self, source: IO[bytes], target: Path, compressed_bytes: int | None = None) -> None:
        """Copy `source` to `target`; `compressed_bytes` (a zip member's) enables the ratio check."""
        member_bytes = 0
        with open(target, "wb") as sink:
            while chunk := source.read(_COPY_CHUNK_BYTES):
                member_bytes += len(chunk)
                self.written_bytes += len(chunk)
                self._check(member_bytes, compressed_bytes)
                sink.write(chunk)

    def _check(self, member_bytes: int, compressed_bytes: int | None) -> None:
        limits = self.limits
        if self.written_bytes > limits.max_decompressed_bytes:
            raise DataIssue("compression_bomb", f"the archive expands to more than {limits.max_decompressed_bytes} "
                            "bytes")
        # many members each under the grace size add up: the whole archive has a ratio too
        if (self.written_bytes > limits.ratio_grace_bytes
                and self.written_bytes > limits.max_compression_ratio * max(self.archive_bytes, 1)):
            raise DataIssue("compression_bomb", f"the archive expands more than {limits.max_compression_ratio:g}x "
                            f"({self.archive_bytes} bytes gave {self.written_bytes})")
        if (compressed_bytes is not None and member_bytes > limits.ratio_grace_bytes
                and member_bytes > limits.max_compression_ratio * max(compressed_bytes, 1)):
            raise DataIssue("compression_bomb", f"an archive member expands more than "
                            f"{limits.max_compression_ratio:g}x")


def _extract_tar(stream: IO[bytes], target_dir: Path, limits: ReadLimits, archive_bytes: int) -> None:
    budget = _Budget(limits, archive_bytes)
    try:
        # "r|": a forward-only stream, so a .tar.gz is read through the guarded gunzip.
        with tarfile.open(fileobj=stream, mode="r|") as archive:
            for member in archive:
                budget.count_member()
                relative = safe_member_path(member.name)
                _check_tar_member(member)
                if relative is None:
                    continue
                destination = target_dir / relative
                if member.isdir():
                    destination.mkdir(parents=True, exist_ok=True)
                    continue
                destination.parent.mkdir(parents=True, exist_ok=True)
                source = archive.extractfile(member)
                if source is not None:
                    budget.copy(source, destination)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise DataIssue("invalid_archive", f"cannot read the tar archive ({exc})") from None


def _check_tar_member(member: tarfile.TarInfo) -> None:
    """Only plain files and folders. A sparse member (GNU or PAX) is a few header bytes that
    `extractfile` expands into its whole declared size of zeros: a 2 KB tar wrote 2 GiB."""
    name = excerpt_of(member.name, 80)
    if member.issparse():
        raise DataIssue("unsafe_archive", f"archive member {name!r} is a sparse file; only plain files and "
                        "folders are accepted", field=member.name)
    if member.type not in _TAR_PLAIN_TYPES:
        raise DataIssue("unsafe_archive", f"archive member {name!r} is a link or special file; only files and "
                        "folders are accepted", field=member.name)


def _extract_zip(raw: IO[bytes], target_dir: Path, limits: ReadLimits, archive_bytes: int) -> None:
    budget = _Budget(limits, archive_bytes)
    try:
        with zipfile.ZipFile(raw) as archive:
            for info in archive.infolist():
                budget.count_member()
                relative = safe_member_path(info.filename)
                if stat.S_IFMT(info.external_attr >> 16) not in (0, stat.S_IFREG, stat.S_IFDIR):
                    raise DataIssue("unsafe_archive", f"archive member {excerpt_of(info.filename, 80)!r} is a link "
                                    "or special file; only files and folders are accepted", field=info.filename)
                if info.compress_type not in _ZIP_METHODS:
                    # bzip2 and lzma members decompress a whole block per read, past the byte count's reach
                    raise DataIssue("invalid_archive", f"archive member {excerpt_of(info.filename, 80)!r} uses zip "
                                    f"compression method {info.compress_type}; only stored and deflated are accepted",
                                    field=info.filename)
                if relative is None:
                    continue
                destination = target_dir / relative
                if info.is_dir():
                    destination.mkdir(parents=True, exist_ok=True)
                    continue
                destination.parent.mkdir(parents=True, exist_ok=True)
                with archive.open(info) as source:
                    budget.copy(source, destination, compressed_bytes=info.compress_size)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, NotImplementedError, RuntimeError, EOFError,
            OSError) as exc:
        raise DataIssue("invalid_archive", f"cannot read the zip archive ({exc})") from None
