"""The serving process's heap: frozen at start and again after a large lazy import."""

from __future__ import annotations

import asyncio
import sys

import pytest

from tuneforge import heap


@pytest.fixture
def frozen(monkeypatch):
    """Each freeze recorded instead of done: a frozen object of the test process would never be freed."""
    calls: list[str] = []
    monkeypatch.setattr(heap.gc, "collect", lambda *a: calls.append("collect") or 0)
    monkeypatch.setattr(heap.gc, "freeze", lambda: calls.append("freeze"))
    return calls


def _app(imports: int):
    async def app(scope, receive, send):
        for number in range(imports):  # what a lazy `import torch` does to sys.modules, on a small scale
            sys.modules[f"_tuneforge_test_module_{number}"] = type(sys)(f"_tuneforge_test_module_{number}")
    return app


def test_the_heap_is_frozen_at_start_and_after_a_request_that_imported_a_library(frozen, monkeypatch):
    monkeypatch.setattr(sys, "modules", dict(sys.modules))  # the fake modules go away with the test
    wrapped = heap.FrozenHeap(_app(0))
    assert frozen == ["collect", "freeze"]  # collected first: garbage is never frozen

    asyncio.run(wrapped({"type": "http"}, None, None))
    assert frozen == ["collect", "freeze"]  # an ordinary request changes nothing

    wrapped.app = _app(heap.NEW_MODULES_BEFORE_SETTLING - 1)
    asyncio.run(wrapped({"type": "http"}, None, None))
    assert len(frozen) == 2  # a handful of modules: not worth a full collection

    wrapped.app = _app(heap.NEW_MODULES_BEFORE_SETTLING)
    asyncio.run(wrapped({"type": "http"}, None, None))
    assert frozen == ["collect", "freeze"] * 2
    asyncio.run(wrapped({"type": "http"}, None, None))
    assert len(frozen) == 4  # counted from the last freeze, not from the start


def test_a_failing_request_still_settles_the_heap(frozen, monkeypatch):
    monkeypatch.setattr(sys, "modules", dict(sys.modules))

    async def fails(scope, receive, send):
        await _app(heap.NEW_MODULES_BEFORE_SETTLING)(scope, receive, send)
        raise RuntimeError("boom")

    wrapped = heap.FrozenHeap(fails)
    with pytest.raises(RuntimeError):
        asyncio.run(wrapped({"type": "http"}, None, None))
    assert frozen == ["collect", "freeze"] * 2
