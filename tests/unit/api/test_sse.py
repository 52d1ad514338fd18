"""Streamed chat answers keep the server free: `api/sse.from_blocking` runs a blocking producer on
a thread of its own (the event loop goes on meanwhile; the producer's clean-up runs when the
consumer leaves), and a server holding more blocked chat streams than the worker pool has
threads still answers other requests."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from contextlib import AsyncExitStack

import httpx
import pytest

from tests.helpers.net import free_port, wait_until
from tests.helpers.platform import add_base_model, add_tenant, fake_model_dir
from tuneforge.api.sse import from_blocking
from tuneforge.serve.params import Chunk, Usage
from tuneforge.server import ControlPlane
from tuneforge.settings import Settings

WAIT_S = 30.0  # generous: every wait ends as soon as what it waits for happens


def test_items_come_in_order_and_a_producer_error_reaches_the_consumer():
    def failing() -> Iterator[int]:
        yield 1
        yield 2
        raise ValueError("the producer broke")

    async def consume() -> list[int]:
        seen = []
        with pytest.raises(ValueError, match="the producer broke"):
            async for item in from_blocking(failing()):
                seen.append(item)
        return seen

    assert asyncio.run(consume()) == [1, 2]


def test_the_loop_runs_while_the_producer_blocks_and_a_leaving_consumer_closes_it():
    gate = threading.Event()
    closed = threading.Event()

    def producer() -> Iterator[int]:
        try:
            yield 1
            # blocks until a coroutine on the loop opens the gate: were the loop blocked too, this
            # would never end
            gate.wait()
            n = 2
            while True:
                yield n
                n += 1
        finally:
            closed.set()

    async def scenario() -> list[int]:
        items = from_blocking(producer())
        first = await asyncio.wait_for(items.__anext__(), WAIT_S)

        async def open_gate() -> None:
            gate.set()

        await asyncio.wait_for(asyncio.gather(open_gate(), asyncio.sleep(0)), WAIT_S)
        second = await asyncio.wait_for(items.__anext__(), WAIT_S)
        await items.aclose()  # the consumer leaves mid-stream
        return [first, second]

    assert asyncio.run(scenario()) == [1, 2]
    assert closed.wait(WAIT_S)  # the producer's own clean-up ran


class GatedEngine:
    """Stands in for the inference engine: each stream sends one chunk, then waits for `gate`."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.waiting = 0
        self._lock = threading.Lock()

    def stream(self, target, prompt, params) -> Iterator[Chunk]:  # noqa: ANN001 - the engine's signature
        yield Chunk("a")
        with self._lock:
            self.waiting += 1
        self.gate.wait(WAIT_S * 4)
        yield Chunk("b", finish_reason="stop", usage=Usage(prompt_tokens=3, completion_tokens=2))


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
                engine.gate.set()
                for lines in opened:
                    lines = [line async for line in lines if line]
                    assert lines[-1] == "data: [DONE]"
                    chunks = [json.loads(line[len("data: "):]) for line in lines[:-1]]
                    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "ab"
                    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"

        asyncio.run(scenario())
    finally:
        engine.gate.set()
        plane.close()
