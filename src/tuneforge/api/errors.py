"""Every error leaves the API in OpenAI's envelope with the right status."""

from __future__ import annotations

import logging
import math

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sqlalchemy import exc as sqlalchemy_exc
from starlette.exceptions import HTTPException as StarletteHTTPException

from tuneforge.domain.errors import ApiError, from_validation_errors
from tuneforge.domain.ids import correlation_id
from tuneforge.storage.envelope import KeyUnavailable

log = logging.getLogger("tuneforge.api")
REQUEST_ID_HEADER = "X-Request-Id"


def respond(error: ApiError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if error.status_code == 401 else {}
    if error.retry_after is not None:
        # whole seconds, at least 1 (RFC 9110); the openai SDK waits this long before its retry
        headers["Retry-After"] = str(max(1, math.ceil(error.retry_after)))
    return JSONResponse(error.envelope(), status_code=error.status_code, headers=headers or None)


BUSY_RETRY_AFTER_S = 1.0


def is_busy(exc: BaseException) -> bool:
    """The database was too busy to answer in time: SQLite's lock outlived the busy timeout, or no
    pooled connection freed up in time. Nothing about the request was wrong."""
    if isinstance(exc, sqlalchemy_exc.TimeoutError):
        return True
    return isinstance(exc, sqlalchemy_exc.OperationalError) and "database is locked" in str(exc.orig)


def _validation_error(request: Request, exc: RequestValidationError) -> ApiError:
    return from_validation_errors(exc.errors(), model=_body_model(request))


def _body_model(request: Request) -> type[BaseModel] | None:
    """The pydantic model the route reads its JSON body as (whose field names an unknown
    parameter's message suggests), if it has one."""
    body_field = getattr(request.scope.get("route"), "body_field", None)
    annotation = getattr(getattr(body_field, "field_info", None), "annotation", None)
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return respond(exc)

    @app.exception_handler(RequestValidationError)
    async def _request_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return respond(_validation_error(request, exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        message = str(exc.detail) if exc.status_code != 404 else "Unknown request URL"
        return respond(ApiError(exc.status_code, message, code=code))

    @app.exception_handler(sqlalchemy_exc.OperationalError)
    @app.exception_handler(sqlalchemy_exc.TimeoutError)
    async def _database_busy(request: Request, exc: Exception) -> JSONResponse:
        if not is_busy(exc):
            return await _unexpected(request, exc)
        # Every wait is bounded (SQLite's busy timeout, the pool's checkout timeout); past it the
        # request is refused as a whole (its transaction rolled back) with a time to come back,
        # which the openai SDK and most HTTP clients honour by retrying.
        request_id = correlation_id("req")
        log.warning("database busy [%s] %s %s: %s", request_id, request.method, request.url.path, exc)
        response = respond(ApiError(
            503, f"The service is busy; nothing was changed. Retry in a moment (request id {request_id}).",
            type="server_error", code="server_busy", retry_after=BUSY_RETRY_AFTER_S))
        response.headers[REQUEST_ID_HEADER] = request_id
        return response

    @app.exception_handler(KeyUnavailable)
    async def _data_key(request: Request, exc: KeyUnavailable) -> JSONResponse:
        # the tenant's data key is revoked (its deletion) or the object is damaged: never a 500
        request_id = correlation_id("req")
        log.warning("object not opened [%s] %s %s: %s", request_id, request.method, request.url.path, exc)
        response = respond(ApiError(
            410, f"This data can no longer be read: its tenant's data key was revoked (request id {request_id}).",
            code="data_key_revoked"))
        response.headers[REQUEST_ID_HEADER] = request_id
        return response

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # the tenant gets an id to quote, the operator's log the exception under that id
        request_id = correlation_id("req")
        log.error("unhandled error [%s] %s %s", request_id, request.method, request.url.path, exc_info=exc)
        response = respond(ApiError(
            500, f"The server had an error while processing your request (request id {request_id}). "
                 "Retry it, or give the request id to your platform operator if the error persists.",
            type="server_error", code="internal_error"))
        response.headers[REQUEST_ID_HEADER] = request_id
        return response
