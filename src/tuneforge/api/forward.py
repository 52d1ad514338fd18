"""The training API of a control plane that serves its API from several worker processes.

The training API's state (sessions, models, futures, the co-training pools: services/training_api)
lives in one process's memory, so it cannot be spread over API workers that share one socket:
the SDK's next request would land on a worker that knows nothing of its session. The parent
process, which holds the one scheduler, holds the training API too and serves it on a loopback
port (`server.ControlPlane`); each API worker forwards every `/tinker/...` request and every
co-training worker's `/internal/v1/pools/...` request there, as it came (credentials included:
the parent checks them again, before it reads a body), and answers what the parent answered.

The request body is streamed through as the parent reads it, so a caller the parent refuses is
not read further; a parent that cannot be reached is a 503 with Retry-After, never a traceback.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from tuneforge.api.errors import respond
from tuneforge.domain.errors import ApiError

log = logging.getLogger(__name__)

PATHS = ("/tinker/{rest:path}", "/internal/v1/pools/{rest:path}")
METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]
# not forwarded either way: they describe one connection, not the request
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
               "transfer-encoding", "upgrade", "host"}
# a held retrieve_future answers within 25 s and a worker's request for work within 20 s
_TIMEOUT = httpx.Timeout(120.0, connect=5.0)
RETRY_AFTER_S = 5.0


def routes(upstream: str) -> list[BaseRoute]:
    """Routes that forward the training API to `upstream` (http://127.0.0.1:PORT of the parent)."""
    clients: dict[int, httpx.AsyncClient] = {}  # one per event loop (a worker process has one)

    def client() -> httpx.AsyncClient:
        import asyncio

        loop = id(asyncio.get_running_loop())
        if loop not in clients:
            clients[loop] = httpx.AsyncClient(base_url=upstream.rstrip("/"), timeout=_TIMEOUT, trust_env=False,
                                              limits=httpx.Limits(max_connections=256, max_keepalive_connections=64))
        return clients[loop]

    async def forward(request: Request) -> Response:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        headers = [(name, value) for name, value in request.headers.raw
                   if name.decode("latin-1").lower() not in _HOP_BY_HOP]
        has_body = request.method in ("POST", "PUT", "PATCH")
        try:
            sent = client().build_request(request.method, target, headers=headers,
                                          content=request.stream() if has_body else None)
            answer = await client().send(sent)
        except httpx.HTTPError as exc:
            log.warning("the training API's process did not answer %s %s: %r", request.method, request.url.path, exc)
            return respond(ApiError(503, "The training API is unavailable for a moment; retry.",
                                           type="server_error", code="training_api_unavailable",
                                           retry_after=RETRY_AFTER_S))
        kept: dict[str, Any] = {name: value for name, value in answer.headers.items()
                                if name.lower() not in _HOP_BY_HOP | {"content-length", "content-encoding"}}
        return Response(answer.content, status_code=answer.status_code, headers=kept)

    return [Route(path, forward, methods=METHODS) for path in PATHS]
