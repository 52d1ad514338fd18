"""Ports and readiness checks for servers the tests start on 127.0.0.1."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, HTTPServer


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_open(host: str, port: int, timeout_s: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def wait_for_http(url: str, timeout_s: float = 30.0, alive=lambda: True) -> None:
    """Block until `url` answers any HTTP status; raise TimeoutError otherwise.

    `alive` is polled too, so a server process that died fails at once rather
    than after the whole timeout.
    """
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        if not alive():
            raise RuntimeError(f"server for {url} exited before answering")
        try:
            with urllib.request.urlopen(url, timeout=1.0):
                return
        except urllib.error.HTTPError:
            return  # any status means the server is up
        except (urllib.error.URLError, OSError) as exc:
            last_error = exc
        time.sleep(0.05)
    raise TimeoutError(f"{url} did not answer within {timeout_s}s: {last_error}")


def wait_until(condition, timeout_s: float, what: str, interval_s: float = 0.1):
    """Poll `condition` until it returns something truthy, and return that; AssertionError
    naming `what` when `timeout_s` passes first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def send_json(handler, payload: object, status: int = 200) -> None:  # noqa: ANN001 - a BaseHTTPRequestHandler
    """Answer the request `handler` serves with `payload` as JSON."""
    import json

    data = json.dumps(payload).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


@contextmanager
def counting_json_server(document: object) -> Iterator[tuple[str, list[str]]]:
    """An HTTP server on 127.0.0.1 that answers every GET with `document` as JSON and records the
    path of each request: (its base URL, the paths asked so far)."""
    hits: list[str] = []
    body = json.dumps(document).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            hits.append(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", hits
    finally:
        server.shutdown()
        server.server_close()
