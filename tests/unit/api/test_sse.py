"""Streamed chat answers keep the server free: a generation's `Sink` is awaited by the event
loop (chunks in order, an error raised to the reader, a reader that leaves cancels the
sequence), and a server holding more waiting chat streams than the worker pool has threads
still answers other requests."""

from __future__ import annotations

import asyncio
import json
import threading
from contextlib import AsyncExitStack

import httpx
import pytest

from tests.helpers.net import free_port, wait_until
from tests.helpers.platform import add_base_model, add_tenant, fake_model_dir
from tuneforge.serve.budget import Lease, TokenBudget
from tuneforge.serve.params import Chunk, Usage
from tuneforge.serve.sinks import Sink
from tuneforge.server import ControlPlane
from tuneforge.settings import Settings

WAIT_S = 30.0  # generous: every wait ends as soon as what it waits for happens


def test_chunks_come_in_order_and_an_error_reaches_the_reader():
    sink = Sink()

    def produce() -> None:
        sink.put(Chunk("a"))
        sink.put(Chunk("b"))
        sink.put(ValueError("the batch broke"))

    async def consume() -> list[str]:
        seen = []
        threading.Thread(target=produce).start()
        with pytest.raises(ValueError, match="the batch broke"):
            async for chunk in sink:
                seen.append(chunk.text)
        return seen

    assert asyncio.run(consume()) == ["a", "b"]
    assert sink.cancelled.is_set()


def test_the_loop_runs_while_the_reader_waits_and_a_leaving_reader_cancels():
    sink = Sink()

    async def scenario() -> list[str]:
        chunks = sink.__aiter__()
        waiting = asyncio.ensure_future(chunks.__anext__())
        await asyncio.sleep(0.05)  # the reader waits; the loop goes on
        assert not waiting.done()
        threading.Thread(target=sink.put, args=(Chunk("first"),)).start()
        first = await asyncio.wait_for(waiting, WAIT_S)
        sink.put(Chunk("second"))
        second = await asyncio.wait_for(chunks.__anext__(), WAIT_S)
        assert not sink.cancelled.is_set()
        await chunks.aclose()  # the reader leaves mid-stream
        return [first.text, second.text]

    assert asyncio.run(scenario()) == ["first", "second"]
    assert sink.cancelled.is_set()  # the batcher drops the sequence at its next step

    blocking = Sink()
    blocking.put(Chunk("x"))
    blocking.end()
    assert [chunk.text for chunk in blocking] == ["x"]


class GatedEngine:
    """Stands in for the inference engine: each stream gets one chunk, then waits until `open()`."""

    def __init__(self) -> None:
        self.sinks: list[Sink] = []
        self._lock = threading.Lock()

    @property
    def waiting(self) -> int:
        with self._lock:
            return len(self.sinks)

    def for_tenant(self, tenant: str, tokens_in_flight: int | None = None) -> GatedEngine:
        return self

    def reserve(self, max_tokens: int, choices: int = 1, *, param: str = "max_tokens") -> Lease:
        return TokenBudget().reserve("alpha", choices * max_tokens, None)  # unbounded: not what this tests

    def under(self, lease: Lease) -> GatedEngine:
        return self

    def submit(self, target, prompt, params) -> Sink:  # noqa: ANN001 - the engine's signature
        sink = Sink()
        sink.put(Chunk("a"))
        with self._lock:
            self.sinks.append(sink)
        return sink

    def open(self) -> None:
        with self._lock:
            for sink in self.sinks:
                sink.put(Chunk("b", finish_reason="stop", usage=Usage(prompt_tokens=3, completion_tokens=2)))
                sink.end()


def test_more_blocked_chat_streams_than_worker_threads_leave_the_server_answering(tmp_path, database_url):
    settings = Settings(home=tmp_path / "home", database_url=database_url, port=free_port())
    plane = ControlPlane(settings, run_scheduler=False).start_in_background()
    engine = GatedEngine()
    try:
        plane.platform.inference = engine
        add_base_model(plane.platform, "tiny-base", fake_model_dir(tmp_path / "model"))
        key = add_tenant(plane.platform, "alpha")
        body = {"model": "tiny-base", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        streams = 60  # the worker pool has 40 threads

        async def scenario() -> None:
            limits = httpx.Limits(max_connections=200)
            async with httpx.AsyncClient(base_url=plane.url, timeout=WAIT_S, limits=limits) as client, \
                    AsyncExitStack() as stack:
                opened = []
                for _ in range(streams):  # one after the other: the point is the open streams, not a burst
                    response = await stack.enter_async_context(client.stream(
                        "POST", "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}))
                    assert response.status_code == 200
                    opened.append(response.aiter_lines())
                await asyncio.to_thread(wait_until, lambda: engine.waiting == streams, WAIT_S,
                                        "every generation to block")
                answers = await asyncio.gather(*(client.get("/healthz") for _ in range(10)))
                assert [a.status_code for a in answers] == [200] * 10
                engine.open()
                for lines in opened:
                    lines = [line async for line in lines if line]
                    assert lines[-1] == "data: [DONE]"
                    chunks = [json.loads(line[len("data: "):]) for line in lines[:-1]]
                    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "ab"
                    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"

        asyncio.run(scenario())
    finally:
        engine.open()
        plane.close()
