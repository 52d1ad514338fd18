"""ProxyStore: the object store as a trainer sees it, through the control plane.

A trainer gets no store credentials: its JobSpec's `storage_url` is
`tuneforge+http(s)://HOST:PORT/internal/v1/jobs/{job_id}/objects` and it authenticates with its
attempt's job token. The control plane (api/routes/objects.py) answers only for the current
attempt of a running job and only for the keys that job may reach (storage/access.py); anything
else is 403 `object_out_of_scope`. The control plane's own store (encrypting, S3, a folder) is
behind it, so what a trainer holds opens nothing else.

Wire: GET KEY (Range: bytes=a-b), HEAD KEY, PUT KEY (streamed body), DELETE KEY, GET ?prefix=P
(a listing: {"keys": [...]}).
"""

from __future__ import annotations

import io
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote

import httpx

from tuneforge.storage.store import PrefixOps

SCHEME_PREFIX = "tuneforge+"
_CHUNK_BYTES = 4 * 1024 * 1024
# a trainer outlives a control plane's restart: requests are tried again for this long
_RETRY_WINDOW_S = 180.0
_RETRY_PAUSE_S = 0.5
_MAX_PAUSE_S = 10.0
_TIMEOUT = httpx.Timeout(connect=10.0, read=300.0, write=300.0, pool=30.0)


class ObjectAccessError(PermissionError):
    """The control plane refused: no valid current attempt (401/409) or a key out of scope (403)."""

    def __init__(self, status_code: int, message: str, code: str | None) -> None:
        super().__init__(f"{status_code} {code or ''}: {message}".strip())
        self.status_code = status_code
        self.code = code


def is_proxy_url(url: str) -> bool:
    return url.startswith(SCHEME_PREFIX + "http://") or url.startswith(SCHEME_PREFIX + "https://")


def proxy_url(public_url: str, job_id: str) -> str:
    """The storage URL a trainer of `job_id` is given, on the control plane at `public_url`."""
    return f"{SCHEME_PREFIX}{public_url.rstrip('/')}/internal/v1/jobs/{quote(job_id, safe='')}/objects"


class _Download(io.RawIOBase):
    """A streamed GET read as a file (nothing held but the transport's buffer); opened through
    io.BufferedReader, it reads by lines and iterates like any binary file."""

    def __init__(self, response: httpx.Response) -> None:
        super().__init__()
        self._response = response
        self._chunks: Iterator[bytes] = response.iter_bytes(_CHUNK_BYTES)
        self._pending = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._pending:
            self._pending = next(self._chunks, b"")
            if not self._pending:
                return 0
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        return size

    def close(self) -> None:
        if not self.closed:
            self._response.close()
        super().close()


def _chunks_of(stream: Any) -> Iterator[bytes]:
    while chunk := stream.read(_CHUNK_BYTES):
        yield chunk


class _Counted:
    """A stream that counts what was read from it."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream
        self.read_bytes = 0

    def read(self, size: int = -1) -> bytes:
        chunk = self._stream.read(size)
        self.read_bytes += len(chunk)
        return chunk


class ProxyStore(PrefixOps):
    """ObjectStore over the control plane's object routes, with the attempt's job token."""

    def __init__(self, url: str, token: str, *, client: httpx.Client | None = None) -> None:
        """`client`: the HTTP client to send with (a test's); default, one of its own."""
        if not is_proxy_url(url):
            raise ValueError(f"not an object proxy URL: {url!r}")
        self.url = url.rstrip("/")
        self._base = self.url[len(SCHEME_PREFIX):]
        self._auth = {"Authorization": f"Bearer {token}"}
        self._client = client if client is not None else httpx.Client(timeout=_TIMEOUT)

    def close(self) -> None:
        self._client.close()

    def _key_url(self, key: str) -> str:
        key = key.strip("/")
        if not key or ".." in key.split("/"):
            raise ValueError(f"invalid object key {key!r}")
        return f"{self._base}/{quote(key, safe='/')}"

    def _send(self, method: str, url: str, *, retry: bool = True, stream: bool = False,
              body: Callable[[], Any] | None = None, **kwargs: Any) -> httpx.Response:
        """The answer to one request, retried for up to `_RETRY_WINDOW_S` while the control plane is
        away or busy (a restart, a deploy); `body` makes each try's content afresh. A refusal raises
        ObjectAccessError, a missing object FileNotFoundError."""
        headers = {**self._auth, **kwargs.pop("headers", {})}
        deadline = time.monotonic() + (_RETRY_WINDOW_S if retry else 0.0)
        pause_s = _RETRY_PAUSE_S
        while True:
            try:
                content = body() if body is not None else kwargs.get("content")
                request = self._client.build_request(method, url, headers=headers,
                                                     **{**kwargs, "content": content})
                response = self._client.send(request, stream=stream)
            except httpx.TransportError:
                if time.monotonic() + pause_s > deadline:
                    raise
                time.sleep(pause_s)
                pause_s = min(pause_s * 2, _MAX_PAUSE_S)
                continue
            if response.status_code >= 500 and time.monotonic() + pause_s <= deadline:
                response.close()
                time.sleep(pause_s)
                pause_s = min(pause_s * 2, _MAX_PAUSE_S)
                continue
            _raise_for(response, url)
            return response

    def put_bytes(self, key: str, data: bytes) -> None:
        self._send("PUT", self._key_url(key), content=data)

    def put_file(self, key: str, local_path: Path) -> None:
        """Streamed from the file, which is read again from its start if a try fails."""
        with open(local_path, "rb") as source:
            def from_start() -> Iterator[bytes]:
                source.seek(0)
                return _chunks_of(source)

            self._send("PUT", self._key_url(key), body=from_start)

    def put_stream(self, key: str, stream: IO[bytes]) -> int:
        counted = _Counted(stream)
        # a stream cannot be read again: one try
        self._send("PUT", self._key_url(key), content=_chunks_of(counted), retry=False)
        return counted.read_bytes

    def get_bytes(self, key: str) -> bytes:
        return self._send("GET", self._key_url(key)).content

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes start..end (inclusive) of `key`."""
        return self._send("GET", self._key_url(key), headers={"Range": f"bytes={start}-{end}"}).content

    def get_file(self, key: str, local_path: Path) -> None:
        local_path = Path(local_path)
        local_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = local_path.with_name(local_path.name + ".part")
        with self.open_read(key) as source, open(tmp, "wb") as target:
            shutil.copyfileobj(source, target, _CHUNK_BYTES)
        tmp.replace(local_path)

    def open_read(self, key: str) -> IO[bytes]:
        return io.BufferedReader(_Download(self._send("GET", self._key_url(key), stream=True)), _CHUNK_BYTES)

    def exists(self, key: str) -> bool:
        try:
            self._send("HEAD", self._key_url(key))
        except FileNotFoundError:
            return False
        return True

    def size_bytes(self, key: str) -> int:
        return int(self._send("HEAD", self._key_url(key)).headers["content-length"])

    def list(self, prefix: str) -> list[str]:
        answer = self._send("GET", self._base, params={"prefix": prefix.strip("/")}).json()
        return sorted(str(key) for key in answer["keys"])

    def delete(self, key: str) -> None:
        self._send("DELETE", self._key_url(key))

    def delete_prefix(self, prefix: str) -> None:
        for key in self.list(prefix):
            self.delete(key)

    def compose(self, key: str, sources: list[tuple[str, int]]) -> str:
        """`key` as the objects `sources` one after another, streamed through this process."""
        keys = [source for source, _size in sources]

        def chunks() -> Iterator[bytes]:
            for source in keys:
                with self.open_read(source) as handle:
                    while chunk := handle.read(_CHUNK_BYTES):
                        yield chunk

        self._send("PUT", self._key_url(key), content=chunks(), retry=False)
        return "streamed"


def _raise_for(response: httpx.Response, url: str) -> None:
    if response.status_code < 400:
        return
    if response.is_stream_consumed is False and not response.is_closed:
        response.read()
    response.close()
    if response.status_code == 404:
        raise FileNotFoundError(url)
    message, code = response.reason_phrase, None
    try:
        error = response.json().get("error") or {}
        message, code = str(error.get("message") or message), error.get("code")
    except (ValueError, AttributeError):
        pass
    if response.status_code in (401, 403, 409):
        raise ObjectAccessError(response.status_code, message, code)
    raise OSError(f"object store proxy: {response.status_code} {code or ''}: {message}")
