"""A real OpenAI-compatible chat endpoint on 127.0.0.1 whose answers each test scripts."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

# (request body) -> (HTTP status, assistant message content)
Responder = Callable[[dict], tuple[int, str]]


@dataclass
class ChatStub:
    url: str = ""
    respond: Responder = lambda body: (200, "TIE")
    delay_s: float = 0.0
    requests: list[dict] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)

    def user_text(self, number: int) -> str:
        return self.requests[number]["messages"][-1]["content"]


def _handler(stub: ChatStub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            stub.requests.append(body)
            stub.paths.append(self.path)
            stub.headers.append(dict(self.headers))
            if stub.delay_s:
                time.sleep(stub.delay_s)
            status, content = stub.respond(body)
            payload = {"id": "chatcmpl-stub", "object": "chat.completion", "created": 0, "model": body["model"],
                       "choices": [{"index": 0, "finish_reason": "stop",
                                    "message": {"role": "assistant", "content": content}}]}
            data = json.dumps(payload if status == 200 else {"error": {"message": content}}).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout test)
                pass

        def log_message(self, *args: object) -> None:
            pass

    return Handler


@pytest.fixture(autouse=True)
def _loopback_endpoints(monkeypatch):
    """The judges and guards here listen on 127.0.0.1, which the egress policy refuses unless
    the operator allow-lists it (as the trainer's environment would say)."""
    monkeypatch.setenv("TUNEFORGE_EGRESS_ALLOW", "127.0.0.1")


@pytest.fixture
def chat_stub() -> Iterator[ChatStub]:
    stub = ChatStub()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(stub))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    stub.url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        yield stub
    finally:
        server.shutdown()
        server.server_close()
