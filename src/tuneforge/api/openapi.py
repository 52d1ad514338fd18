"""The OpenAPI document says what the API answers: errors in OpenAI's envelope, 400 (never 422).

FastAPI documents a 422 with its own error shape for every operation that
validates input; this API answers such requests 400 in OpenAI's envelope
(`api/errors.py`). `install` post-processes the generated document once:

- every operation: 400 with the envelope instead of 422;
- operations that take a tenant's or the admin's key: 401;
- operations that take a tenant's key: 429 (the tier's rate limits, `api/ratelimits.py`);
- operations with path parameters or on the admin API (off by default): 404;
- operations with a body: 413 (`api/guard.py` limits the size);
- the codes a route declares itself with `error_responses(...)` (409, 429...);
- the schemas of the Server-Sent Events of streaming routes (`event_stream(...)`), which FastAPI
  only adds for JSON bodies.

Each route's 2xx body is its `response_model` (api/schemas/).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

from tuneforge.api.schemas.errors import ErrorEnvelope

ENVELOPE_REF = "#/components/schemas/ErrorEnvelope"

DESCRIPTIONS = {
    400: "Invalid request: the message names the parameter (`param`).",
    401: "Missing or invalid API key.",
    403: "The tenant's quota refuses the request.",
    404: "No such resource (or another tenant's).",
    409: "The resource is not in a state that allows this.",
    413: "The request body is larger than the limit.",
    422: "The model produced no answer of the asked shape (response_format json_schema, a forced tool call).",
    429: "Too many requests or jobs right now; retry later.",
    503: "The model cannot be served right now.",
}


def error_responses(*status_codes: int) -> dict[int | str, dict[str, Any]]:
    """`responses=` for a route that can answer these codes besides the ones every route documents."""
    return {code: {"model": ErrorEnvelope, "description": DESCRIPTIONS[code]} for code in status_codes}


def binary_body(media_type: str, description: str) -> dict[int | str, dict[str, Any]]:
    """`responses=` for a route whose 200 is a file's bytes (declare `response_class` a streaming one)."""
    return {200: {"description": description,
                  "content": {media_type: {"schema": {"type": "string", "format": "binary"}}}}}


_STREAMED: dict[str, type[BaseModel]] = {}


def event_stream(model: type[BaseModel], description: str) -> dict[int | str, dict[str, Any]]:
    """`responses=` for a route that streams with `stream=true`: its 200 may also be Server-Sent
    Events, each message's `data` one `model` (then `data: [DONE]`)."""
    _STREAMED[model.__name__] = model
    schema = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {200: {"description": description, "content": {"text/event-stream": {"schema": schema}}}}


def _error(code: int) -> dict[str, Any]:
    return {"description": DESCRIPTIONS[code], "content": {"application/json": {"schema": {"$ref": ENVELOPE_REF}}}}


def _takes_a_key(operation: dict[str, Any]) -> bool:
    """Whether the operation reads the Authorization header (a tenant's or the admin's key)."""
    return any(p.get("in") == "header" and p.get("name", "").lower() == "authorization"
               for p in operation.get("parameters", ()))


# OpenAPI links: what a created object's id leads to (clients and stateful fuzzing follow them)
_LINKS: dict[tuple[str, str, str], tuple[str, str, str, tuple[tuple[str, str], ...]]] = {
    ("post", "/v1/files", "200"): ("file_id", "$response.body#/id", "/v1/files/{file_id}", (
        ("get", "GetFile"), ("get", "GetFileContent"), ("get", "GetFileValidation"), ("delete", "DeleteFile"))),
    ("post", "/v1/fine_tuning/jobs", "200"): ("job_id", "$response.body#/id", "/v1/fine_tuning/jobs/{job_id}", (
        ("get", "GetJob"), ("post", "CancelJob"), ("get", "GetJobEvents"), ("get", "GetJobCheckpoints"))),
    ("post", "/v1/webhooks", "200"): ("webhook_id", "$response.body#/id", "/v1/webhooks/{webhook_id}", (
        ("get", "GetWebhook"), ("post", "UpdateWebhook"), ("get", "GetWebhookDeliveries"),
        ("delete", "DeleteWebhook"))),
    ("post", "/v1/routes", "200"): ("name", "$response.body#/name", "/v1/routes/{name}", (
        ("get", "GetRoute"), ("patch", "UpdateRoute"), ("get", "GetRouteStats"), ("post", "PromoteRouteVersion"),
        ("delete", "DeleteRoute"))),
    ("post", "/v1/secrets", "201"): ("name", "$response.body#/name", "/v1/secrets/{name}", (
        ("delete", "DeleteSecret"),)),
}
_SUFFIXES = {"GetFileContent": "/content", "GetFileValidation": "/validation", "CancelJob": "/cancel",
             "GetJobEvents": "/events", "GetJobCheckpoints": "/checkpoints", "GetWebhookDeliveries": "/deliveries",
             "GetRouteStats": "/stats", "PromoteRouteVersion": "/promote"}


def _with_links(document: dict[str, Any]) -> None:
    paths = document.get("paths", {})
    for (method, path, status), (param, expression, target, linked) in _LINKS.items():
        response = paths.get(path, {}).get(method, {}).get("responses", {}).get(status)
        if response is None:
            continue
        links = response.setdefault("links", {})
        for target_method, name in linked:
            target_path = target + _SUFFIXES.get(name, "")
            if target_method not in paths.get(target_path, {}):
                continue
            pointer = target_path.replace("~", "~0").replace("/", "~1")
            links[name] = {"operationRef": f"#/paths/{pointer}/{target_method}", "parameters": {param: expression}}


def with_error_responses(document: dict[str, Any]) -> dict[str, Any]:
    for path, operations in document.get("paths", {}).items():
        for _method, operation in operations.items():
            responses = operation.setdefault("responses", {})
            responses.pop("422", None)
            codes = {400}
            if _takes_a_key(operation):
                codes.add(401)
                if not path.startswith("/v1/admin"):
                    codes.add(429)
            if "{" in path or path.startswith("/v1/admin"):
                codes.add(404)
            if "requestBody" in operation:
                codes.add(413)
            for code in codes:
                responses.setdefault(str(code), _error(code))
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    envelope = ErrorEnvelope.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas.update(envelope.pop("$defs", {}))
    schemas["ErrorEnvelope"] = envelope
    for name, model in _STREAMED.items():
        streamed = model.model_json_schema(ref_template="#/components/schemas/{model}", mode="serialization")
        for inner, definition in streamed.pop("$defs", {}).items():
            schemas.setdefault(inner, definition)
        schemas.setdefault(name, streamed)
    _with_links(document)
    return document


def install(app: FastAPI) -> None:
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = with_error_responses(generate())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
