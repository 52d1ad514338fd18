"""Server-Sent Events responses, on sse-starlette: the framing both streamed APIs share (job
events, chat and text completions).

sse-starlette runs the stream as a task on the event loop, sends a keep-alive comment while
the stream has nothing to say, and notices a client that went away (then the stream's
generator is cancelled, and its `finally` runs). A stream must therefore never block: it
awaits (a generation's chunks come from a `serve.sinks.Sink`, awaited).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

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
