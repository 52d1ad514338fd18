"""The edge every request passes before a route: body size, JSON shape, and a URL without NUL.

A pure ASGI wrapper, so that it acts on the bytes as they arrive:

- An upload (`POST /v1/files`) is counted while it streams: past the tenant
  tier's limit (plus the multipart framing) the answer is 413 at once, before
  the rest is spooled to disk; a `Content-Length` that says so is refused
  before a byte is read. An Upload's part (`POST /v1/uploads/{id}/parts`) is
  metered the same way against the 64 MiB a part may hold.
- Every other body is read whole up to `MAX_JSON_BODY_BYTES` (413 beyond it)
  and, when it is JSON, decoded once here: nesting deeper than
  `MAX_JSON_DEPTH`, a lone surrogate or NUL in a string, a number that is not
  finite (`1e400`, `NaN`) or an integer outside int64 answer 400 naming the
  field, so no route, tokenizer or database ever sees them. The body then
  reaches the route unchanged.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tuneforge.api.errors import respond
from tuneforge.api.limits import (
    INT64_MAX,
    INT64_MIN,
    MAX_JSON_BODY_BYTES,
    MAX_JSON_DEPTH,
    MULTIPART_OVERHEAD_BYTES,
)
from tuneforge.domain.errors import ApiError, invalid

UPLOAD_PATH = "/v1/files"
PART_PATH = re.compile(r"^/v1/uploads/[^/]+/parts/?$")


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
        if scope["method"] == "POST" and scope["path"].rstrip("/") == UPLOAD_PATH:
            limit = await _upload_limit(scope) + MULTIPART_OVERHEAD_BYTES
            await _MeteredUpload(self.app, limit)(scope, receive, send)
            return
        if scope["method"] == "POST" and PART_PATH.match(scope["path"]):
            from tuneforge.services.uploads import MAX_PART_BYTES

            await _MeteredUpload(self.app, MAX_PART_BYTES + MULTIPART_OVERHEAD_BYTES)(scope, receive, send)
            return
        body = await _read_body(scope, receive, MAX_JSON_BODY_BYTES)
        if body is None:  # the client went away
            return
        if isinstance(body, ApiError):
            await respond(body)(scope, receive, send)
            return
        if body and _is_json(scope):
            problem = json_problem(body)
            if problem is not None:
                await respond(problem)(scope, receive, send)
                return
        await self.app(scope, _replay(body, receive), send)


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


def _is_json(scope: Scope) -> bool:
    content_type = (_header(scope, b"content-type") or "").split(";")[0].strip().lower()
    return content_type == "application/json" or (content_type.startswith("application/")
                                                   and content_type.endswith("+json"))


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


# ---- JSON --------------------------------------------------------------------------------------

def json_problem(body: bytes) -> ApiError | None:
    """The 400 for a JSON body the API will not take, naming the field; None when it is fine."""
    try:
        document = json.loads(body)
    except RecursionError:
        return _too_deep(None)
    except ValueError as exc:  # malformed JSON, bad UTF-8, an integer of thousands of digits
        reason = getattr(exc, "msg", None) or str(exc).split(":")[0]
        return ApiError(400, f"We could not parse the JSON body of your request. ({reason})", code="invalid_json")
    stack: list[tuple[Any, tuple[str, ...]]] = [(document, ())]
    while stack:
        value, path = stack.pop()
        if isinstance(value, (dict, list)):
            if len(path) >= MAX_JSON_DEPTH:
                return _too_deep(".".join(path))
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                where = (*path, str(key))
                if isinstance(key, str) and (problem := _string_problem(key, where, "key")):
                    return problem
                stack.append((item, where))
        elif isinstance(value, str):
            if problem := _string_problem(value, path, "value"):
                return problem
        elif isinstance(value, float) and not math.isfinite(value):
            return _field_error(path, "must be a finite number (1e400, Infinity and NaN are not)")
        elif isinstance(value, int) and not isinstance(value, bool) and not INT64_MIN <= value <= INT64_MAX:
            return _field_error(path, f"integers must lie within [{INT64_MIN}, {INT64_MAX}]")
    return None


def _string_problem(text: str, path: tuple[str, ...], what: str) -> ApiError | None:
    if "\x00" in text:
        return _field_error(path, f"a string {what} must not contain NUL (\\u0000)")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _field_error(path, f"a string {what} must be valid Unicode: a lone surrogate "
                                  "(\\ud800-\\udfff without its pair) is not")
    return None


def _field_error(path: tuple[str, ...], reason: str) -> ApiError:
    param = ".".join(path) or None
    return invalid(f"Invalid value for {param or 'body'}: {reason}", param=param, code="invalid_value")


def _too_deep(param: str | None) -> ApiError:
    return invalid(f"The JSON body is nested more than {MAX_JSON_DEPTH} levels deep.", param=param,
                   code="json_too_deep")


# ---- uploads -----------------------------------------------------------------------------------

async def _upload_limit(scope: Scope) -> int:
    """The calling tenant's tier limit; without a valid key the largest one (the route answers 401)."""
    from tuneforge.api import deps
    from tuneforge.services import tenants as tenant_service

    platform = scope["app"].state.platform
    settings = platform.settings
    authorization = _header(scope, b"authorization")

    def lookup() -> int:
        try:
            caller = platform.keys.tenant(authorization) or deps.verify_key(platform, authorization)
        except ApiError:
            return max(settings.max_upload_bytes_by_tier(t) for t in tenant_service.TIERS)
        return settings.max_upload_bytes_by_tier(caller.tier)

    return await anyio.to_thread.run_sync(lookup)


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
