"""The edge every request passes before a route: credentials before the body, body size, JSON
shape, and a URL without NUL.

A pure ASGI wrapper, so that it acts on the bytes as they arrive:

- A request that carries a body to an authenticated route (the tenants' `/v1`, the admin API,
  the trainers' `/internal`) has its credentials checked first, from the headers alone
  (api/credentials.py): without them it gets its 401 before a byte of the body is read, parsed
  or spooled. A tenant's request is then admitted by its tier's request limits here (not again
  by the route), so a body over them is refused unread too. A public route takes no body, so
  none is read for it.
- An upload (`POST /v1/files`) is counted while it streams: past the tenant
  tier's limit (plus the multipart framing) the answer is 413 at once, before
  the rest is spooled to disk; a `Content-Length` that says so is refused
  before a byte is read. An Upload's part (`POST /v1/uploads/{id}/parts`) is
  metered the same way against the 64 MiB a part may hold.
- Every other body is read whole up to `MAX_JSON_BODY_BYTES` (413 beyond it)
  and, when it is JSON, checked with bounded work (api/json_body.py): more
  than `MAX_JSON_VALUES` values is a 413 before any parse; nesting deeper than
  `MAX_JSON_DEPTH`, a number that is not finite or an integer outside int64
  answer 400 naming the field, and in a tenant's body so do NUL and lone
  surrogates. A large body is checked in a thread (at most
  `MAX_CONCURRENT_JSON_CHECKS` at once), so the event loop goes on answering.
  The body then reaches the route unchanged.
"""

from __future__ import annotations

import re
from functools import partial

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tuneforge.api import credentials, json_body
from tuneforge.api.deps import ADMITTED_AT_EDGE
from tuneforge.api.errors import respond
from tuneforge.api.limits import (
    MAX_CONCURRENT_JSON_CHECKS,
    MAX_INLINE_JSON_BYTES,
    MAX_JSON_BODY_BYTES,
    MULTIPART_OVERHEAD_BYTES,
)
from tuneforge.api.ratelimits import Admission
from tuneforge.domain.errors import ApiError, invalid
from tuneforge.services.tenancy.api_keys import Caller

UPLOAD_PATH = "/v1/files"
PART_PATH = re.compile(r"^/v1/uploads/[^/]+/parts/?$")
# a trainer's object written through the proxy (api/routes/objects.py): streamed, never read here
OBJECT_PATH = re.compile(r"^/internal/v1/jobs/[^/]+/objects/.")
# threads for large JSON checks: a request beyond them waits for a turn without holding a thread
_JSON_CHECKS = anyio.CapacityLimiter(MAX_CONCURRENT_JSON_CHECKS)


def too_large(limit_bytes: int) -> ApiError:
    return ApiError(413, f"The request body is larger than the limit of {limit_bytes} bytes.",
                    param=None, code="request_too_large")


class RequestGuard:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        problem = url_problem(scope)
        if problem is not None:
            await respond(problem)(scope, receive, send)
            return
        who = credentials.audience(scope["path"])
        if who == "public" or not _has_body(scope):
            await self.app(scope, receive, send)  # nothing to read: the route checks what it needs
            return
        try:
            caller = await credentials.check(scope, who)
        except ApiError as error:
            await respond(error)(scope, receive, send)
            return
        if caller is None:  # the operator, or a trainer: no request limits
            await self._with_body(scope, receive, send, caller, content_rules=who != "trainer")
            return
        # A tenant's body is read only within its tier's request limits (in flight, per window):
        # otherwise one key could hold any number of 16 MiB bodies in memory at once.
        slot = Admission()
        try:
            await scope["app"].state.rate_limiter.admit_request(scope, caller.tenant_id, caller.tier, slot)
        except ApiError as error:
            await respond(error)(scope, receive, send)
            return
        scope[ADMITTED_AT_EDGE] = True
        try:
            await self._with_body(scope, receive, send, caller, content_rules=True)
        finally:
            slot.release()

    async def _with_body(self, scope: Scope, receive: Receive, send: Send, caller: Caller | None, *,
                         content_rules: bool) -> None:
        if scope["method"] == "POST" and scope["path"].rstrip("/") == UPLOAD_PATH and caller is not None:
            settings = scope["app"].state.platform.settings
            limit = settings.max_upload_bytes_by_tier(caller.tier) + MULTIPART_OVERHEAD_BYTES
            await _MeteredUpload(self.app, limit)(scope, receive, send)
            return
        if scope["method"] == "POST" and PART_PATH.match(scope["path"]):
            from tuneforge.services.datasets.uploads import MAX_PART_BYTES

            await _MeteredUpload(self.app, MAX_PART_BYTES + MULTIPART_OVERHEAD_BYTES)(scope, receive, send)
            return
        if scope["method"] == "PUT" and OBJECT_PATH.match(scope["path"]) and caller is None:
            settings = scope["app"].state.platform.settings
            await _MeteredUpload(self.app, settings.trainer_object_max_bytes)(scope, receive, send)
            return
        body = await _read_body(scope, receive, MAX_JSON_BODY_BYTES)
        if body is None:  # the client went away
            return
        if isinstance(body, ApiError):
            await respond(body)(scope, receive, send)
            return
        if body and _is_json(scope):
            problem = await json_problem_of(body, content_rules=content_rules)
            if problem is not None:
                await respond(problem)(scope, receive, send)
                return
        await self.app(scope, _replay(body, receive), send)


async def json_problem_of(body: bytes, *, content_rules: bool = True) -> ApiError | None:
    """`json_body.check`, on the event loop for a small body, in a thread for a large one."""
    if len(body) <= MAX_INLINE_JSON_BYTES:
        return json_body.check(body, content_rules=content_rules)
    return await anyio.to_thread.run_sync(partial(json_body.check, body, content_rules=content_rules),
                                          limiter=_JSON_CHECKS)


def url_problem(scope: Scope) -> ApiError | None:
    """PostgreSQL refuses NUL in text: a path or query holding one is a 400, not a database error."""
    if "\x00" in scope["path"]:
        return invalid("The URL path must not contain NUL characters.", code="invalid_value")
    if b"%00" in scope.get("query_string", b"") or b"\x00" in scope.get("query_string", b""):
        return invalid("Query parameters must not contain NUL characters.", code="invalid_value")
    return None


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def _content_length(scope: Scope) -> int | None:
    value = _header(scope, b"content-length")
    return int(value) if value is not None and value.strip().isdigit() else None


def _has_body(scope: Scope) -> bool:
    """Whether the request says it carries a body (HTTP/1.1: a length above 0, or chunks)."""
    declared = _header(scope, b"content-length")
    if declared is not None:
        return declared.strip() != "0"
    return _header(scope, b"transfer-encoding") is not None


def _is_json(scope: Scope) -> bool:
    """Whether the route's framework will parse the body as JSON: FastAPI does for any media type
    whose subtype is `json` or ends in `+json` (`text/json` too), so the check covers them all."""
    content_type = (_header(scope, b"content-type") or "").split(";")[0].strip().lower()
    subtype = content_type.partition("/")[2]
    return subtype == "json" or subtype.endswith("+json")


async def _read_body(scope: Scope, receive: Receive, limit_bytes: int) -> bytes | ApiError | None:
    declared = _content_length(scope)
    if declared is not None and declared > limit_bytes:
        return too_large(limit_bytes)
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit_bytes:
            return too_large(limit_bytes)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """The body once, as one message; then whatever the server says next (a disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


# ---- uploads -----------------------------------------------------------------------------------

class _BodyTooLarge(Exception):
    pass


class _MeteredUpload:
    """Passes the body through as it arrives, counting; past `limit_bytes` the read fails and
    whatever the route would answer is replaced by the 413."""

    def __init__(self, app: ASGIApp, limit_bytes: int) -> None:
        self.app = app
        self.limit_bytes = limit_bytes
        self.received_bytes = 0
        self.exceeded = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        declared = _content_length(scope)
        if declared is not None and declared > self.limit_bytes:
            await respond(too_large(self.limit_bytes))(scope, receive, send)
            return

        async def counted() -> Message:
            if self.exceeded:
                raise _BodyTooLarge
            message = await receive()
            if message["type"] == "http.request":
                self.received_bytes += len(message.get("body", b""))
                if self.received_bytes > self.limit_bytes:
                    self.exceeded = True
                    raise _BodyTooLarge
            return message

        async def guarded_send(message: Message) -> None:
            if not self.exceeded:
                await send(message)

        try:
            await self.app(scope, counted, guarded_send)
        except _BodyTooLarge:
            pass
        except Exception:
            if not self.exceeded:
                raise
        if self.exceeded:
            await respond(too_large(self.limit_bytes))(scope, receive, send)
