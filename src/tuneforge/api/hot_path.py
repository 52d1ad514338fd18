"""The most polled request, `GET /v1/fine_tuning/jobs/{job_id}`, answered before the app.

Dashboards and CI pipelines poll a job's status many times a second. Through the app such a
request crossed a dozen ASGI layers (the request guard reading an empty body, routing against
every route before it, the exception middlewares, FastAPI's request handler) that together cost
more CPU than the job read itself (docs/benchmarks-api.md, "GET job on the hot path"). `HotPath`
sits outside the app, inside the security headers and the rate-limit door, and answers that one
request with what the route does (`job_answer`): the caller from the API key cache, the tier's
limits, the lean read, the same bytes and headers.

Anything else goes to the app unchanged: other paths and methods, a path with more segments or
a NUL in its query, and a request whose answer met an error that is not the API's own (a
database that failed, a bug): the app answers that one again from the start, so that its error
handlers log it under a correlation id and send the envelope as for any route. The route stays
registered: the app's fallback, and the operation in the OpenAPI document."""

from __future__ import annotations

import re
from collections.abc import MutableMapping
from typing import Any

from tuneforge.api.deps import admitted_caller
from tuneforge.api.errors import respond
from tuneforge.domain.errors import ApiError
from tuneforge.services.training import jobs as job_service

JOB_PATH = re.compile(r"/v1/fine_tuning/jobs/([^/\x00]+)")
_JSON_HEADERS = [(b"content-type", b"application/json")]


def authorization_of(scope: MutableMapping[str, Any]) -> str | None:
    for name, value in scope["headers"]:
        if name == b"authorization":
            return value.decode("latin-1")
    return None


async def job_answer(state: Any, scope: MutableMapping[str, Any], job_id: str) -> bytes:
    """GET job: the job object as JSON for the caller of `scope` (the app's `state`: its key
    look-ups, rate limiter and job bodies). Raises the API's errors: 401, 429, 404."""
    async with admitted_caller(state, scope, authorization_of(scope)) as caller:
        body = await state.job_bodies.read(caller.tenant_id, job_id)
    if body is None:
        raise job_service.not_found_job(job_id)
    return body


class HotPath:
    def __init__(self, app: Any, state: Any) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "GET":
            match = JOB_PATH.fullmatch(scope["path"])
            query = scope.get("query_string", b"")
            if match is not None and b"%00" not in query and b"\x00" not in query:
                if await self._job(scope, receive, send, match.group(1)):
                    return
        await self.app(scope, receive, send)

    async def _job(self, scope: MutableMapping[str, Any], receive: Any, send: Any, job_id: str) -> bool:
        """Answer the request; False when the app must (an error that is not the API's own)."""
        try:
            body = await job_answer(self.state, scope, job_id)
        except ApiError as error:
            await respond(error)(scope, receive, send)
            return True
        except Exception:  # noqa: BLE001 - the app answers it again and reports it as for any route
            return False
        await send({"type": "http.response.start", "status": 200,
                    "headers": [*_JSON_HEADERS, (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
        return True
