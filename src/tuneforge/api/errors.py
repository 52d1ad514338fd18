"""Every error leaves the API in OpenAI's envelope with the right status."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from tuneforge.domain.errors import ApiError, from_validation_errors

log = logging.getLogger("tuneforge.api")


def respond(error: ApiError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if error.status_code == 401 else None
    return JSONResponse(error.envelope(), status_code=error.status_code, headers=headers)


def _validation_error(exc: RequestValidationError) -> ApiError:
    return from_validation_errors(exc.errors())


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return respond(exc)

    @app.exception_handler(RequestValidationError)
    async def _request_validation(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return respond(_validation_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        message = str(exc.detail) if exc.status_code != 404 else "Unknown request URL"
        return respond(ApiError(exc.status_code, message, code=code))

    @app.exception_handler(Exception)
    async def _unexpected(_request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return respond(ApiError(500, "The server had an error while processing your request.",
                                 type="server_error", code="internal_error"))
