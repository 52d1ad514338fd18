"""The cyclic garbage collector in a process that serves until it exits.

A full collection walks every tracked object. The control plane keeps hundreds of thousands of
them for its whole life (modules, classes, functions), about half a million once a job create
has imported torch and transformers to check a model's modules, and a full collection then
took ~250 ms, a pause every request in flight waited through. At thousands of requests a
second (a flood of refused requests) full collections came every few seconds, and those
pauses were the p99 of every tenant (docs/benchmarks-api.md, "A flood from one tenant").

`FrozenHeap` wraps a serving process's ASGI app: at start, and after any request during which
the process imported a batch of new modules (a lazy import of a large library), it collects
once and then freezes everything that exists, so that later collections only walk what came
after. Only for processes that serve until they exit: a frozen object is never collected, and
in-process test servers, which come and go, are left alone."""

from __future__ import annotations

import gc
import sys
from typing import Any

# A lazy import of a large library brings in hundreds of modules; a handful is a plugin's.
NEW_MODULES_BEFORE_SETTLING = 50


class FrozenHeap:
    """ASGI: the app, with the heap frozen at start and after each large import."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self._modules_at_freeze = 0
        self.settle()

    def settle(self) -> None:
        gc.collect()
        gc.freeze()
        self._modules_at_freeze = len(sys.modules)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await self.app(scope, receive, send)
        finally:
            if len(sys.modules) - self._modules_at_freeze >= NEW_MODULES_BEFORE_SETTLING:
                self.settle()
