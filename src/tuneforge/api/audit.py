"""The audit edge: every answered request that may change state (POST, PUT, PATCH, DELETE) of a
tenant's or the operator's API is appended to the audit log (services/tenancy/audit.py) with its
caller, its route, the resource it named or created, its status and its request id.

A pure ASGI wrapper inside the app's middleware (api/app.py), so it sees the answer that leaves,
errors included. The request id is the answer's `X-Request-Id` (set here when the route did not
set one). Requests that change nothing are not recorded: refused credentials (401, or the admin
API while it is off), estimates, inference, the training API's per-step calls and the trainers'
reports (their effects on a job are recorded as its transitions). The row is written after the
answer is sent, in a thread; a failure to write it is logged, never the request's failure.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import anyio
import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tuneforge.api import credentials
from tuneforge.api.errors import REQUEST_ID_HEADER
from tuneforge.domain.ids import correlation_id
from tuneforge.services.tenancy import audit as audit_service

log = logging.getLogger(__name__)

_MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# routes that take a POST but change nothing a tenant owns (or change it once a step, where the
# run's own checkpoints record it)
UNRECORDED_ROUTES = frozenset({
    "estimate_job", "estimate_price", "chat_completions", "completions", "run_grader", "validate_grader",
    "client_config", "dynamic_config", "telemetry", "heartbeat", "get_info", "forward_backward",
    "optim_step", "asample", "create_sampling_session", "weights_info", "retrieve_future", "cancel_future",
})
MAX_CAPTURED_BYTES = 64 * 1024  # a create's answer is read for its id up to this size
_PARAM = re.compile(r"^\{([^}:]+)(:[^}]*)?\}$")
_ID_FIELDS = ("id", "model_id", "session_id", "model_path")


class AuditTrail:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in _MUTATING:
            await self.app(scope, receive, send)
            return
        who = credentials.audience(scope["path"])
        if who not in ("tenant", "admin"):
            await self.app(scope, receive, send)
            return
        answer: dict[str, Any] = {"status": 0, "request_id": None, "json": False, "body": bytearray()}

        async def watching(message: Message) -> None:
            if message["type"] == "http.response.start":
                answer["status"] = message["status"]
                headers = list(message.get("headers", []))
                for name, value in headers:
                    lowered = name.lower()
                    if lowered == REQUEST_ID_HEADER.lower().encode():
                        answer["request_id"] = value.decode("latin-1")
                    elif lowered == b"content-type":
                        answer["json"] = value.startswith(b"application/json")
                if answer["request_id"] is None:
                    answer["request_id"] = correlation_id("req")
                    headers.append((REQUEST_ID_HEADER.encode(), answer["request_id"].encode()))
                    message = {**message, "headers": headers}
            elif message["type"] == "http.response.body" and answer["json"]:
                body: bytearray = answer["body"]
                if len(body) <= MAX_CAPTURED_BYTES:
                    body.extend(message.get("body", b"")[:MAX_CAPTURED_BYTES + 1 - len(body)])
            await send(message)

        try:
            await self.app(scope, receive, watching)
        finally:
            outcome = _outcome(scope, who, answer)
            if outcome is not None:
                await _write(scope, outcome)


def _outcome(scope: Scope, who: str, answer: dict[str, Any]) -> audit_service.RequestOutcome | None:
    route = scope.get("route")
    name = getattr(route, "name", None)
    status = int(answer["status"])
    if name is None or name in UNRECORDED_ROUTES or status in (0, 401):
        return None  # no route (404 of an unknown path), nothing changed, or an unknown caller
    authorization = credentials.authorization_of(scope)
    if who == "admin" and credentials.admin_refusal(scope["app"].state.platform.settings, authorization):
        return None
    template = getattr(route, "path", scope["path"])
    params = scope.get("path_params") or {}
    resource_type, resource_id = _resource(template, params)
    created = _created(answer) if resource_id is None else {}  # a create: its id is in the answer
    resource_id = resource_id or created.get("id")
    summary: dict[str, Any] = {"method": scope["method"], "path": scope["path"][:200]}
    if created.get("status") is not None:
        summary["status"] = created["status"]
    api_key = None
    if who == "tenant" and authorization:
        api_key = authorization.partition(" ")[2].strip() or None
    # the tenant an admin route acts on: the one it names, or the one it created
    tenant_name = params.get("name") if template.startswith("/v1/admin/tenants/") else None
    tenant_id = created.get("id") if name == "create_tenant" else None
    return audit_service.RequestOutcome(
        audience=who, action=name, resource_type=resource_type, resource_id=resource_id, status_code=status,
        request_id=answer["request_id"], summary=summary, api_key=api_key, tenant_name=tenant_name,
        tenant_id=tenant_id)


def _resource(template: str, params: dict[str, Any]) -> tuple[str, str | None]:
    """(the kind of resource, its id): the literal segment before the route's last parameter and that
    parameter's value; a route without one (a create) names the collection, its id from the answer."""
    segments = [s for s in template.split("/") if s]
    last_param = None
    for index, segment in enumerate(segments):
        match = _PARAM.match(segment)
        if match is not None:
            last_param = (index, match.group(1))
    if last_param is None:
        literal = [s for s in segments if s not in ("v1", "api", "admin", "tinker")]
        return (literal[-1] if literal else "api"), None
    index, param = last_param
    kind = segments[index - 1] if index > 0 and not _PARAM.match(segments[index - 1]) else param
    return kind, str(params.get(param, ""))[:256] or None


def _created(answer: dict[str, Any]) -> dict[str, Any]:
    body = bytes(answer["body"])
    if not answer["json"] or not body or len(body) > MAX_CAPTURED_BYTES:
        return {}
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return {}
    if not isinstance(parsed, dict):
        return {}
    found: dict[str, Any] = {}
    for field in _ID_FIELDS:
        if isinstance(parsed.get(field), str):
            found["id"] = parsed[field][:256]
            break
    if isinstance(parsed.get("status"), str):
        found["status"] = parsed["status"][:64]
    return found


async def _write(scope: Scope, outcome: audit_service.RequestOutcome) -> None:
    db = scope["app"].state.platform.db

    def append() -> None:
        with db.session() as session:
            audit_service.record_request(session, outcome)

    try:
        with anyio.CancelScope(shield=True):  # a client gone at the last byte does not unrecord the change
            await anyio.to_thread.run_sync(append)
    except Exception:  # the answer is sent; the operator's log says what the audit log missed
        log.exception("could not record %s %s (request %s) in the audit log", scope["method"], scope["path"],
                      outcome.request_id)
