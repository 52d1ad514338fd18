"""Moving object bytes between a request and the control plane's store without holding an object in
memory or blocking the event loop (api/routes/objects.py): a download is a generator Starlette
iterates in a thread, an upload a bounded queue that a thread drains into `put_stream`."""

from __future__ import annotations

import asyncio
import contextlib
import queue
from collections.abc import AsyncIterator, Iterator
from typing import Any

from tuneforge.domain.errors import ApiError

CHUNK_BYTES = 1024 * 1024
_QUEUED_CHUNKS = 16  # at most this many received chunks wait for the store (uvicorn's are ~64 KiB)
_FULL_WAIT_S = 0.02  # how often a full queue is looked at again


def parse_range(header: str | None, size_bytes: int) -> tuple[int, int] | None:
    """(first, last) byte of a single `bytes=` range within an object of `size_bytes`, None for the
    whole object; 416 for a range it cannot answer. Several ranges are answered as the whole."""
    if not header:
        return None
    unit, _, spec = header.strip().partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return None
    first_text, dash, last_text = spec.strip().partition("-")
    try:
        if not dash:
            raise ValueError(header)
        if not first_text:  # the last N bytes
            suffix = int(last_text)
            if suffix <= 0:
                raise ValueError(header)
            first, last = max(0, size_bytes - suffix), size_bytes - 1
        else:
            first = int(first_text)
            last = int(last_text) if last_text else size_bytes - 1
    except ValueError:
        raise _unsatisfiable(size_bytes) from None
    if first < 0 or first >= size_bytes or last < first:
        raise _unsatisfiable(size_bytes)
    return first, min(last, size_bytes - 1)


def _unsatisfiable(size_bytes: int) -> ApiError:
    return ApiError(416, f"the range asked is not within the object's {size_bytes} bytes",
                    "invalid_request_error", "range", "range_not_satisfiable")


def read_chunks(store: Any, key: str, first: int, length: int) -> Iterator[bytes]:
    """`length` bytes of `key` from byte `first`, a chunk at a time (a sync generator: Starlette runs
    it in a thread)."""
    with store.open_read(key) as handle:
        _skip(handle, first)
        left = length
        while left > 0:
            chunk = handle.read(min(CHUNK_BYTES, left))
            if not chunk:
                break
            left -= len(chunk)
            yield chunk


def _skip(handle: Any, first: int) -> None:
    if not first:
        return
    try:
        handle.seek(first)
        return
    except (AttributeError, OSError, ValueError):  # a stream that cannot seek (a decrypting wrapper)
        pass
    left = first
    while left > 0:
        chunk = handle.read(min(CHUNK_BYTES, left))
        if not chunk:
            return
        left -= len(chunk)


class _End:
    """What the receiving side puts last: None ends the object, an exception aborts it."""

    def __init__(self, failure: BaseException | None) -> None:
        self.failure = failure


class _Pipe:
    """The upload as a file the store's `put_stream` reads from its thread."""

    def __init__(self) -> None:
        self.chunks: queue.Queue[bytes | _End] = queue.Queue(maxsize=_QUEUED_CHUNKS)
        self._pending = b""
        self._ended = False

    def read(self, size: int = -1) -> bytes:
        size = CHUNK_BYTES if size is None or size < 0 else size
        while len(self._pending) < size and not self._ended:
            item = self.chunks.get()
            if isinstance(item, _End):
                self._ended = True
                if item.failure is not None:
                    raise OSError("the upload was aborted") from item.failure
                break
            self._pending += item
        out, self._pending = self._pending[:size], self._pending[size:]
        return out


async def _offer(pipe: _Pipe, item: bytes | _End, writer: asyncio.Future) -> bool:
    """Puts `item` for the writer; False if the writer has ended (it takes nothing more)."""
    while True:
        try:
            pipe.chunks.put_nowait(item)
            return True
        except queue.Full:
            if writer.done():
                return False
            done, _ = await asyncio.wait({writer}, timeout=_FULL_WAIT_S)
            if done:
                return False


async def receive_into(store: Any, key: str, chunks: AsyncIterator[bytes], limit_bytes: int) -> int:
    """Writes the request body `chunks` to `key`, refusing (413) past `limit_bytes`; an upload that
    fails or is refused leaves no object behind. Returns the bytes written."""
    pipe = _Pipe()
    writer = asyncio.ensure_future(asyncio.to_thread(store.put_stream, key, pipe))
    received = 0
    try:
        async for chunk in chunks:
            received += len(chunk)
            if received > limit_bytes:
                raise ApiError(413, f"an object written through the proxy is at most {limit_bytes} bytes",
                               "invalid_request_error", None, "object_too_large")
            if chunk and not await _offer(pipe, chunk, writer):
                break
        await _offer(pipe, _End(None), writer)
        return int(await writer)
    except BaseException as exc:
        await _offer(pipe, _End(exc), writer)
        with contextlib.suppress(Exception):
            await writer
        with contextlib.suppress(Exception):
            await asyncio.to_thread(store.delete, key)
        raise
