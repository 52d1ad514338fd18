"""Server-Sent Events responses, on sse-starlette: the framing both streamed APIs share (job
events, chat and text completions), and a bridge that keeps a blocking producer off the
event loop.

sse-starlette runs the stream as a task on the event loop, sends a keep-alive comment while
the stream has nothing to say, and notices a client that went away (then the stream's
generator is cancelled, and its `finally` runs). A stream must therefore never block: it
awaits, and anything blocking runs in a thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from typing import TypeVar

from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.background import BackgroundTask

SEPARATOR = "\n"  # the line ending the API has always sent; SSE clients accept \n, \r\n and \r
DONE = "[DONE]"  # OpenAI's last message of a stream
T = TypeVar("T")


def message(data: str, event_id: str | None = None) -> ServerSentEvent:
    return ServerSentEvent(data, id=event_id, sep=SEPARATOR)


def response(frames: AsyncIterator[ServerSentEvent], *, keepalive_s: float,
             background: BackgroundTask | None = None) -> EventSourceResponse:
    return EventSourceResponse(
        frames, sep=SEPARATOR, ping=keepalive_s, background=background,
        ping_message_factory=lambda: ServerSentEvent(comment="keep-alive", sep=SEPARATOR))


_END = object()


async def from_blocking(items: Iterator[T], *, thread_name: str = "tuneforge-stream") -> AsyncIterator[T]:
    """The items of a blocking iterator, produced on a thread of its own and handed over to the
    event loop through a queue.

    A thread of its own rather than the worker pool: a producer can block for long (a generation
    waiting for its model behind others), and a pool full of such waits would stall every other
    request. The thread also owns the iterator to the end: it stops at the next item once the
    consumer has gone, and closes the iterator itself (a generator cannot be closed from another
    thread while it runs), so the producer's clean-up always runs."""
    loop = asyncio.get_running_loop()
    handed: asyncio.Queue = asyncio.Queue()  # unbounded: a generation's output is bounded by max_tokens
    consumer_gone = threading.Event()

    def hand_over(item: object, error: BaseException | None = None) -> None:
        try:
            loop.call_soon_threadsafe(handed.put_nowait, (item, error))
        except RuntimeError:  # the loop has closed: nobody reads any more
            consumer_gone.set()

    def produce() -> None:
        try:
            for item in items:
                if consumer_gone.is_set():
                    break
                hand_over(item)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the consumer
            hand_over(_END, exc)
        else:
            hand_over(_END)
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()

    threading.Thread(target=produce, name=thread_name, daemon=True).start()
    try:
        while True:
            item, error = await handed.get()
            if error is not None:
                raise error
            if item is _END:
                return
            yield item
    finally:
        consumer_gone.set()
