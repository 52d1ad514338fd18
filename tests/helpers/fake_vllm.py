"""A small HTTP server that implements the vLLM OpenAI-server endpoints tuneforge calls, as
vLLM documents them: the model list (adapters with their `parent`), the runtime LoRA API
(`/v1/load_lora_adapter`, `/v1/unload_lora_adapter`, on with VLLM_ALLOW_RUNTIME_LORA_UPDATING) and
chat/completions (plain and streamed). It records every request exactly as it arrived, so a
test asserts what tuneforge sent.

Answers are canned: the text names the model that produced it (`vllm says hi from <model>`)
and the usage counts words. `fail_next` makes the next generation answer an error status;
`refuse` names adapters a load refuses (as vLLM refuses a rank above --max-lora-rank).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


@dataclass
class Seen:
    method: str
    path: str
    authorization: str | None
    body: Any


@dataclass
class FakeVllm:
    base: str  # --served-model-name
    adapter_root_on_server: str  # lora paths under it must exist under local_root
    local_root: Path
    api_key: str | None = None
    seen: list[Seen] = field(default_factory=list)
    loaded: dict[str, str] = field(default_factory=dict)  # lora_name -> lora_path
    refuse: dict[str, str] = field(default_factory=dict)  # lora_name -> the 400 message its load gets
    fail_next: list[tuple[int, str, dict[str, str]]] = field(default_factory=list)  # status, body, headers
    answer_text: str | None = None  # what every generation says instead of the canned text
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def requests(self, path: str | None = None) -> list[Seen]:
        return [seen for seen in self.seen if path is None or seen.path == path]

    def start(self) -> FakeVllm:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args: Any) -> None:
                return

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                fake.seen.append(Seen("GET", self.path, self.headers.get("Authorization"), None))
                if not self._authorized():
                    return
                if self.path == "/v1/models":
                    data = [{"id": fake.base, "object": "model", "root": "/models/base", "parent": None}]
                    data += [{"id": name, "object": "model", "root": path, "parent": fake.base}
                             for name, path in fake.loaded.items()]
                    self._json(200, {"object": "list", "data": data})
                elif self.path == "/health":
                    self._json(200, {})
                else:
                    self._json(404, {"detail": "Not Found"})

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                body = json.loads(raw) if raw else None
                fake.seen.append(Seen("POST", self.path, self.headers.get("Authorization"), body))
                if not self._authorized():
                    return
                handlers = {"/v1/load_lora_adapter": self._load, "/v1/unload_lora_adapter": self._unload,
                            "/v1/chat/completions": self._generate, "/v1/completions": self._generate}
                handler = handlers.get(self.path)
                if handler is None:
                    self._json(404, {"detail": "Not Found"})
                else:
                    handler(body)

            def _authorized(self) -> bool:
                if fake.api_key and self.headers.get("Authorization") != f"Bearer {fake.api_key}":
                    self._json(401, {"error": "Unauthorized"})
                    return False
                return True

            def _load(self, body: dict[str, Any]) -> None:
                name, path = body.get("lora_name"), body.get("lora_path")
                if name in fake.loaded:
                    self._error(400, f"The lora adapter '{name}' has already been loaded.", "InvalidUserInput")
                elif name in fake.refuse:
                    self._error(400, fake.refuse[name], "BadRequestError")
                elif not isinstance(path, str) or not path.startswith(fake.adapter_root_on_server + "/") or not (
                        fake.local_root / path[len(fake.adapter_root_on_server) + 1:] / "adapter_config.json"
                ).exists():
                    self._error(400, f"No adapter found for {path}", "BadRequestError")
                else:
                    fake.loaded[name] = path
                    self._text(200, f"Success: LoRA adapter '{name}' added successfully.")

            def _unload(self, body: dict[str, Any]) -> None:
                name = body.get("lora_name")
                if fake.loaded.pop(name, None) is None:
                    self._error(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")
                else:
                    self._text(200, f"Success: LoRA adapter '{name}' removed successfully.")

            def _generate(self, body: dict[str, Any]) -> None:
                model = body.get("model")
                if fake.fail_next:
                    status, text, headers = fake.fail_next.pop(0)
                    self._raw(status, text.encode(), "application/json", headers)
                    return
                if model != fake.base and model not in fake.loaded:
                    self._error(404, f"The model `{model}` does not exist.", "NotFoundError")
                    return
                text = fake.answer_text if fake.answer_text is not None else f"vllm says hi from {model}"
                chat = self.path == "/v1/chat/completions"
                prompt_tokens = 7
                if not body.get("stream"):
                    choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop",
                               "logprobs": None} if chat else
                              {"index": 0, "text": text, "finish_reason": "stop", "logprobs": None})
                    self._json(200, {"id": "chatcmpl-upstream" if chat else "cmpl-upstream",
                                     "object": "chat.completion" if chat else "text_completion", "created": 1,
                                     "model": model, "choices": [choice],
                                     "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(text.split()),
                                               "total_tokens": prompt_tokens + len(text.split())}})
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                usage = (body.get("stream_options") or {}).get("include_usage")
                kind = "chat.completion.chunk" if chat else "text_completion"

                def send(event: dict[str, Any]) -> None:
                    self.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
                    self.wfile.flush()

                head = {"id": "chatcmpl-upstream", "object": kind, "created": 1, "model": model}
                extra = {"usage": None} if usage else {}
                for word in text.split(" "):
                    piece = word if word == "vllm" else " " + word
                    choice = {"index": 0, "delta": {"content": piece}, "finish_reason": None} if chat else \
                        {"index": 0, "text": piece, "finish_reason": None}
                    send(head | {"choices": [choice]} | extra)
                send(head | {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"} if chat else
                                         {"index": 0, "text": "", "finish_reason": "stop"}]} | extra)
                if usage:
                    send(head | {"choices": [], "usage": {"prompt_tokens": prompt_tokens,
                                                          "completion_tokens": len(text.split()),
                                                          "total_tokens": prompt_tokens + len(text.split())}})
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()

            def _error(self, status: int, message: str, kind: str) -> None:
                self._json(status, {"object": "error", "message": message, "type": kind, "param": None,
                                    "code": status})

            def _json(self, status: int, payload: Any) -> None:
                self._raw(status, json.dumps(payload).encode(), "application/json", {})

            def _text(self, status: int, text: str) -> None:
                self._raw(status, text.encode(), "text/plain", {})

            def _raw(self, status: int, data: bytes, content_type: str, headers: dict[str, str]) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
