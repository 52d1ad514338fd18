"""Every error leaves the API in OpenAI's envelope with the right status."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from tuneforge.domain.errors import ApiError

log = logging.getLogger("tuneforge.api")


def _respond(error: ApiError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if error.status_code == 401 else None
    return JSONResponse(error.envelope(), status_code=error.status_code, headers=headers)


def _param(loc: tuple) -> str | None:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header", "form")]
    # pydantic puts the union branch name in the path ('int', 'literal[...]'): drop it
    parts = [p for p in parts if not p.startswith(("literal[", "function-")) and p not in ("int", "float", "str", "bool")]
    return ".".join(parts) or None


def _validation_error(exc: RequestValidationError) -> ApiError:
    errors = exc.errors()
    for err in errors:
        if err.get("type") == "json_invalid":
            return ApiError(400, "We could not parse the JSON body of your request. "
                                 f"({err.get('ctx', {}).get('error', 'invalid JSON')})", code="invalid_json")
    extra = [e for e in errors if e.get("type") == "extra_forbidden"]
    if extra:
        names = sorted({_param(e["loc"]) or "?" for e in extra})
        return ApiError(400, f"Unknown parameter(s): {', '.join(names)}", param=names[0], code="unknown_parameter")
    first = errors[0]
    param = _param(first["loc"])
    if first.get("type") == "missing":
        return ApiError(400, f"Missing required parameter: '{param}'", param=param, code="missing_required_parameter")
    messages = sorted({f"{_param(e['loc'])}: {e['msg']}" for e in errors})
    return ApiError(400, "Invalid value for " + "; ".join(messages), param=param, code="invalid_value")


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return _respond(exc)

    @app.exception_handler(RequestValidationError)
    async def _request_validation(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return _respond(_validation_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        message = str(exc.detail) if exc.status_code != 404 else "Unknown request URL"
        return _respond(ApiError(exc.status_code, message, code=code))

    @app.exception_handler(Exception)
    async def _unexpected(_request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return _respond(ApiError(500, "The server had an error while processing your request.",
                                 type="server_error", code="internal_error"))
