"""A stand-in for the control plane's /internal/v1 report endpoints.

A stdlib HTTP server on 127.0.0.1 that records every report and answers with
what a test scripts: `answer(kind, body) -> (status, json)`; by default 200
with `{"action": "continue"}` for heartbeats and `{"ok": true}` otherwise.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.helpers.net import send_json

Answer = Callable[[str, dict[str, Any]], tuple[int, dict[str, Any]]]


def default_answer(kind: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    return 200, ({"action": "continue"} if kind == "heartbeat" else {"ok": True})


@dataclass
class Received:
    kind: str
    body: dict[str, Any]
    authorization: str
    status: int


@dataclass
class FakeControlPlane:
    answer: Answer = default_answer
    received: list[Received] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeControlPlane:
        plane = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                kind = self.path.rstrip("/").rsplit("/", 1)[-1]
                status, reply = plane.answer(kind, body)
                with plane._lock:
                    plane.received.append(
                        Received(kind, body, self.headers.get("Authorization", ""), status)
                    )
                send_json(self, reply, status)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # keep test output clean

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def accepted(self, kind: str) -> list[dict[str, Any]]:
        """Bodies of the reports of `kind` that were answered 2xx."""
        with self._lock:
            return [r.body for r in self.received if r.kind == kind and 200 <= r.status < 300]

    def accepted_events(self) -> list[dict[str, Any]]:
        return [event for body in self.accepted("events") for event in body["events"]]

    def accepted_events_with_attempt(self) -> list[tuple[dict[str, Any], int]]:
        return [(event, int(body["attempt"])) for body in self.accepted("events") for event in body["events"]]

    def __enter__(self) -> FakeControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
