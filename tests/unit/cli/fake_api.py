"""A stand-in tuneforge API for CLI tests that need no server: canned JSON per path, served through
httpx's mock transport to every `Api()` a command makes."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

Answer = Any | Callable[[httpx.Request], httpx.Response]


def serve(monkeypatch: pytest.MonkeyPatch, answers: dict[str, Answer]) -> list[httpx.Request]:
    """Answer `GET /v1<path>` (and any method) with `answers[path]`: JSON, or a function of the request;
    returns the requests made, in order."""
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        path = request.url.path.removeprefix("/v1")
        if path not in answers:
            return httpx.Response(404, json={"error": {"message": f"no {path}", "type": "invalid_request_error",
                                                       "param": None, "code": "not_found"}})
        answer = answers[path]
        return answer(request) if callable(answer) else httpx.Response(200, json=answer)

    real_client = httpx.Client
    monkeypatch.setattr(httpx, "Client", lambda **options: real_client(transport=httpx.MockTransport(handle),
                                                                       **options))
    return seen


def sse(events: list[dict]) -> Callable[[httpx.Request], httpx.Response]:
    body = "".join(f"data: {json.dumps(event)}\n\n" for event in events) + "data: [DONE]\n\n"
    return lambda _request: httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})


ENV = {"TUNEFORGE_BASE_URL": "http://tuneforge.test/v1", "TUNEFORGE_API_KEY": "tf-test-key"}
