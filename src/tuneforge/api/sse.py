"""Server-Sent Events responses, on sse-starlette: the framing both streamed APIs share (job
events, chat and text completions).

sse-starlette runs the stream as a task on the event loop, sends a keep-alive comment while
the stream has nothing to say, and notices a client that went away (then the stream's
generator is cancelled, and its `finally` runs). A stream must therefore never block: it
awaits (a generation's chunks come from a `serve.sinks.Sink`, awaited).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing
from typing import Any

from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.background import BackgroundTask

SEPARATOR = "\n"  # the line ending the API has always sent; SSE clients accept \n, \r\n and \r
DONE = "[DONE]"  # OpenAI's last message of a stream


def message(data: str, event_id: str | None = None) -> ServerSentEvent:
    return ServerSentEvent(data, id=event_id, sep=SEPARATOR)


def response(frames: AsyncIterator[ServerSentEvent], *, keepalive_s: float,
             background: BackgroundTask | None = None) -> EventSourceResponse:
    return EventSourceResponse(
        frames, sep=SEPARATOR, ping=keepalive_s, background=background,
        ping_message_factory=lambda: ServerSentEvent(comment="keep-alive", sep=SEPARATOR))


def chunks_response(events: Iterator[dict[str, Any]] | AsyncIterator[dict[str, Any]], *,
                    keepalive_s: float) -> EventSourceResponse:
    """An OpenAI stream: the chunks as messages, then `data: [DONE]`. Chunks still being generated
    come from an async iterator (awaited, no thread held); whole answers from a plain one."""
    async def frames() -> AsyncIterator[ServerSentEvent]:
        if isinstance(events, Iterator):
            for event in events:
                yield message(json.dumps(event, separators=(",", ":")))
        else:
            async with aclosing(events) as chunks:
                async for event in chunks:
                    yield message(json.dumps(event, separators=(",", ":")))
        yield message(DONE)

    return response(frames(), keepalive_s=keepalive_s)
