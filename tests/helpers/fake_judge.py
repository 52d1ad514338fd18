"""An OpenAI-compatible chat (and embeddings) endpoint on 127.0.0.1 that records what it is asked."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.helpers.net import send_json


class FakeJudge:
    """An OpenAI-compatible chat endpoint on 127.0.0.1 answering each request with the next reply."""

    def __init__(self, replies: list[dict[str, Any]]) -> None:
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        judge = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with judge.lock:
                    judge.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
                    asked = len(judge.requests)
                if self.path.endswith("/embeddings"):  # a word's vector: its letters a, b, c counted
                    texts = body["input"]
                    rows = [{"index": n, "embedding": [float(text.count(c)) for c in "abc"]}
                            for n, text in enumerate(texts)]
                    send_json(self, {"object": "list", "data": rows})
                    return
                message = replies[min(asked, len(replies)) - 1]
                send_json(self, {"id": "c", "object": "chat.completion", "created": 0, "model": "m",
                                 "choices": [{"index": 0, "finish_reason": "stop", "message": message}],
                                 "usage": {"prompt_tokens": 30, "completion_tokens": 7, "total_tokens": 37}})

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.server.shutdown()
