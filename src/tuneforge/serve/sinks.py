"""Where a generation's chunks go: filled by the batcher's thread, read by a thread or awaited
by an event loop. No torch here: the API imports it at start."""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import AsyncIterator, Iterator
from typing import Any

from tuneforge.serve.params import Chunk, Completion

_END = object()


class Sink:
    """A request's chunks as the batcher hands them out, read by a thread (`for chunk in sink`)
    or by an event loop (`async for chunk in sink`). An exception put here is raised to the
    reader. `cancel()` (the reader went away) makes the batcher drop the sequence."""

    def __init__(self) -> None:
        self._items: deque = deque()
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None
        self.cancelled = threading.Event()

    def put(self, item: Any) -> None:
        with self._lock:
            self._items.append(item)
            self._ready.notify()
            loop, event = self._loop, self._event
        if loop is not None and event is not None:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # the reader's loop is closed: nobody reads any more
                self.cancelled.set()

    def end(self) -> None:
        self.put(_END)

    def cancel(self) -> None:
        self.cancelled.set()

    def __iter__(self) -> Iterator[Chunk]:
        try:
            while True:
                with self._lock:
                    while not self._items:
                        self._ready.wait()
                    item = self._items.popleft()
                if not _delivered(item):
                    return
                yield item
        finally:
            self.cancel()  # done, failed or abandoned: the batcher stops working for it

    async def __aiter__(self) -> AsyncIterator[Chunk]:
        with self._lock:
            self._loop = asyncio.get_running_loop()
            self._event = asyncio.Event()
        try:
            while True:
                with self._lock:
                    item = self._items.popleft() if self._items else None
                    if item is None:
                        self._event.clear()
                if item is None:
                    await self._event.wait()
                    continue
                if not _delivered(item):
                    return
                yield item
        finally:
            self.cancel()

    def completion(self) -> Completion:
        """The whole answer (blocks until the generation ends)."""
        return completion_of(list(self))

    async def acompletion(self) -> Completion:
        """The whole answer, awaited."""
        return completion_of([chunk async for chunk in self])


def _delivered(item: Any) -> bool:
    """Whether `item` is a chunk to hand out (False: the end); an exception put here is raised."""
    if item is _END:
        return False
    if isinstance(item, BaseException):
        raise item
    return True


def completion_of(chunks: list[Chunk]) -> Completion:
    last = chunks[-1]
    assert last.finish_reason is not None and last.usage is not None
    logprobs = tuple(entry for chunk in chunks for entry in chunk.logprobs)
    return Completion("".join(chunk.text for chunk in chunks), last.finish_reason, last.usage, logprobs)
