"""ObjectStore: the one seam between tuneforge and blob storage.

`FsspecStore` serves a local folder (file://) and S3 (s3://bucket/prefix) with
the same code. Keys are relative, '/'-separated and built by `layout`.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Protocol

import fsspec

from tuneforge.security.env import private_dirs


class ObjectStore(Protocol):
    url: str

    def put_bytes(self, key: str, data: bytes) -> None: ...
    def put_file(self, key: str, local_path: Path) -> None: ...
    def put_stream(self, key: str, stream: IO[bytes]) -> int: ...
    def get_bytes(self, key: str) -> bytes: ...
    def get_file(self, key: str, local_path: Path) -> None: ...
    def open_read(self, key: str) -> IO[bytes]: ...
    def exists(self, key: str) -> bool: ...
    def size_bytes(self, key: str) -> int: ...
    def list(self, prefix: str) -> list[str]: ...
    def delete(self, key: str) -> None: ...
    def delete_prefix(self, prefix: str) -> None: ...
    def download_prefix(self, prefix: str, local_dir: Path) -> list[Path]: ...
    def upload_dir(self, local_dir: Path, prefix: str) -> list[str]: ...
    def compose(self, key: str, sources: list[tuple[str, int]]) -> str: ...


_COPY_CHUNK_BYTES = 4 * 1024 * 1024
# S3's multipart rules: every part but the last at least 5 MiB, at most 10,000 parts
S3_MIN_PART_BYTES = 5 * 1024 * 1024
S3_MAX_PARTS = 10_000


class _Concatenated:
    """The objects `keys` read one after another, as one stream (nothing held but a chunk)."""

    def __init__(self, store: FsspecStore, keys: list[str]) -> None:
        self._store = store
        self._keys = list(keys)
        self._handle: IO[bytes] | None = None

    def read(self, size: int = -1) -> bytes:
        size = _COPY_CHUNK_BYTES if size is None or size < 0 else size
        while True:
            if self._handle is None:
                if not self._keys:
                    return b""
                self._handle = self._store.open_read(self._keys.pop(0))
            chunk = self._handle.read(size)
            if chunk:
                return chunk
            self._handle.close()
            self._handle = None

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


class PrefixOps:
    """What every store does the same way over its own `list`, `get_file` and `put_file` (which the
    class it is mixed into defines): the folders under a prefix, a prefix to a local folder and back."""

    list: Callable[[str], list[str]]
    get_file: Callable[[str, Path], None]
    put_file: Callable[[str, Path], None]

    def iter_dirs(self, prefix: str) -> Iterator[str]:
        """Immediate child 'folders' of `prefix`, as keys."""
        keys = self.list(prefix)
        seen: set[str] = set()
        depth = len(prefix.strip("/").split("/"))
        for key in keys:
            parts = key.split("/")
            if len(parts) > depth + 1:
                child = "/".join(parts[: depth + 1])
                if child not in seen:
                    seen.add(child)
                    yield child

    def download_prefix(self, prefix: str, local_dir: Path) -> list[Path]:
        """Copy every key under `prefix` into `local_dir`, keeping relative paths."""
        local_dir = Path(local_dir)
        written = []
        strip = len(prefix.strip("/")) + 1
        for key in self.list(prefix):
            target = local_dir / key[strip:]
            self.get_file(key, target)
            written.append(target)
        return written

    def upload_dir(self, local_dir: Path, prefix: str) -> list[str]:
        """Copy a local folder's files under `prefix`; returns the keys written."""
        local_dir = Path(local_dir)
        keys = []
        for path in sorted(p for p in local_dir.rglob("*") if p.is_file()):
            key = f"{prefix.strip('/')}/{path.relative_to(local_dir).as_posix()}"
            self.put_file(key, path)
            keys.append(key)
        return keys


class FsspecStore(PrefixOps):
    """Object store over any fsspec filesystem rooted at `url`."""

    def __init__(self, url: str, storage_options: dict | None = None) -> None:
        self.url = url.rstrip("/")
        self.storage_options = dict(storage_options or {})
        protocol = url.split("://", 1)[0] if "://" in url else "file"
        if protocol == "file":
            root = url.split("://", 1)[1] if "://" in url else url
            self._root = str(Path(root).resolve())
            private_dirs(Path(self._root))
            self.fs = fsspec.filesystem("file", auto_mkdir=True)
        else:
            self._root = url.split("://", 1)[1].rstrip("/")
            # No listings cache: trainers and the control plane write the same
            # prefixes from different processes, and a cached listing would hide
            # their objects (exists() False, list() short) until it expired.
            options = {"use_listings_cache": False, **self.storage_options}
            self.fs = fsspec.filesystem(protocol, **options)
        self.protocol = protocol

    def _path(self, key: str) -> str:
        key = key.strip("/")
        if not key or ".." in key.split("/"):
            raise ValueError(f"invalid object key {key!r}")
        return f"{self._root}/{key}"

    def _open_write(self, key: str) -> IO[bytes]:
        """A new object for writing. A local store keeps tenants' data private to the platform's
        user: folders 0700, files 0600, whatever the process umask."""
        path = self._path(key)
        if self.protocol != "file":
            return self.fs.open(path, "wb")
        private_dirs(Path(path).parent)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)  # an object written before keeps its old mode otherwise
        return os.fdopen(fd, "wb")

    def put_bytes(self, key: str, data: bytes) -> None:
        with self._open_write(key) as handle:
            handle.write(data)

    def put_file(self, key: str, local_path: Path) -> None:
        with open(local_path, "rb") as source:
            self.put_stream(key, source)

    def put_stream(self, key: str, stream: IO[bytes]) -> int:
        written = 0
        with self._open_write(key) as handle:
            while chunk := stream.read(_COPY_CHUNK_BYTES):
                handle.write(chunk)
                written += len(chunk)
        return written

    def get_bytes(self, key: str) -> bytes:
        with self.fs.open(self._path(key), "rb") as handle:
            return handle.read()

    def get_file(self, key: str, local_path: Path) -> None:
        local_path = Path(local_path)
        local_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = local_path.with_name(local_path.name + ".part")
        with self.fs.open(self._path(key), "rb") as source, open(tmp, "wb") as target:
            shutil.copyfileobj(source, target, _COPY_CHUNK_BYTES)
        tmp.replace(local_path)

    def open_read(self, key: str) -> IO[bytes]:
        return self.fs.open(self._path(key), "rb")

    def exists(self, key: str) -> bool:
        return bool(self.fs.exists(self._path(key)))

    def size_bytes(self, key: str) -> int:
        return int(self.fs.size(self._path(key)))

    def list(self, prefix: str) -> list[str]:
        """Every key under `prefix` (recursive), sorted, relative to the store root."""
        base = self._path(prefix)
        try:
            found = self.fs.find(base)
        except FileNotFoundError:
            return []
        root = self._root.rstrip("/") + "/"
        keys = []
        for path in found:
            path = str(path)
            if path.startswith(root):
                keys.append(path[len(root):])
        return sorted(keys)

    def delete(self, key: str) -> None:
        try:
            self.fs.rm(self._path(key))
        except FileNotFoundError:
            pass

    def delete_prefix(self, prefix: str) -> None:
        for key in self.list(prefix):
            self.delete(key)
        if self.protocol == "file":
            shutil.rmtree(self._path(prefix), ignore_errors=True)

    def compose(self, key: str, sources: list[tuple[str, int]]) -> str:
        """Write `key` as the objects `sources` ((key, size) pairs) one after another. On S3 the
        bytes never leave the store when its multipart rules allow (every source but the last at
        least 5 MiB): one multipart upload whose parts are server-side copies; anywhere else they
        are streamed through, a chunk at a time. Returns how: "server-side" or "streamed"."""
        keys = [source for source, _size in sources]
        sizes = [size for _source, size in sources]
        if (self.protocol == "s3" and keys and len(keys) <= S3_MAX_PARTS
                and all(size >= S3_MIN_PART_BYTES for size in sizes[:-1])):
            self._s3_multipart_copy(key, keys)
            return "server-side"
        stream = _Concatenated(self, keys)
        try:
            self.put_stream(key, stream)
        finally:
            stream.close()
        return "streamed"

    def _s3_multipart_copy(self, key: str, sources: list[str]) -> None:
        bucket, target, _version = self.fs.split_path(self._path(key))
        upload = self.fs.call_s3("create_multipart_upload", Bucket=bucket, Key=target)
        try:
            parts = []
            for number, source in enumerate(sources, start=1):
                copied = self.fs.call_s3("upload_part_copy", Bucket=bucket, Key=target, UploadId=upload["UploadId"],
                                         CopySource=self._path(source), PartNumber=number)
                parts.append({"PartNumber": number, "ETag": copied["CopyPartResult"]["ETag"]})
            self.fs.call_s3("complete_multipart_upload", Bucket=bucket, Key=target, UploadId=upload["UploadId"],
                            MultipartUpload={"Parts": parts})
        except BaseException:
            self.fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=target, UploadId=upload["UploadId"])
            raise
        self.fs.invalidate_cache(self._path(key))


def open_store(url: str, storage_options: dict | None = None) -> FsspecStore:
    return FsspecStore(url, storage_options)
