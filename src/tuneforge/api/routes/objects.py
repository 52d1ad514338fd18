"""/internal/v1/jobs/{job_id}/objects — the object store as a trainer reaches it (storage/proxy.py):
only the current attempt's job token opens it, and only for the objects that job may reach
(storage/access.py, services/training/objects.py). The token and the key are checked before a
byte of a body is read; the bytes move in threads, a chunk at a time, through the control plane's
store as configured (whatever it seals or encrypts stays on this side)."""

from __future__ import annotations

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from tuneforge.api.object_io import parse_range, read_chunks, receive_into
from tuneforge.api.schemas.base import ObjectRoute
from tuneforge.api.schemas.internal import ObjectKeys, ObjectWritten
from tuneforge.domain.errors import ApiError
from tuneforge.services.training.objects import Grant, check_key, check_prefix

router = APIRouter(prefix="/internal/v1/jobs/{job_id}/objects", tags=["internal"], include_in_schema=False,
                   route_class=ObjectRoute)


async def _grant(request: Request, job_id: str, authorization: str | None) -> Grant:
    return await run_in_threadpool(request.app.state.object_grants.get, job_id, authorization)


async def _size(request: Request, key: str) -> int:
    try:
        return int(await run_in_threadpool(request.app.state.platform.store.size_bytes, key))
    except (FileNotFoundError, IsADirectoryError):
        raise ApiError(404, f"no object {key}", "invalid_request_error", "key", "object_not_found") from None


@router.get("", response_model=ObjectKeys)
async def list_objects(request: Request, job_id: str, prefix: str = Query(max_length=1024),
                       authorization: str | None = Header(default=None)) -> dict:
    """The keys under `prefix`, which must lie inside one of the attempt's folders."""
    prefix = check_prefix(await _grant(request, job_id, authorization), prefix)
    return {"keys": await run_in_threadpool(request.app.state.platform.store.list, prefix)}


@router.api_route("/{key:path}", methods=["HEAD"], response_class=Response)
async def head_object(request: Request, job_id: str, key: str,
                      authorization: str | None = Header(default=None)) -> Response:
    key = check_key(await _grant(request, job_id, authorization), "read", key, write=False)
    size = await _size(request, key)
    return Response(headers={"Content-Length": str(size), "Accept-Ranges": "bytes"},
                    media_type="application/octet-stream")


@router.get("/{key:path}", response_class=StreamingResponse)
async def get_object(request: Request, job_id: str, key: str, authorization: str | None = Header(default=None),
                     range_header: str | None = Header(default=None, alias="range")) -> Response:
    """The object, or one `Range: bytes=a-b` of it (206)."""
    key = check_key(await _grant(request, job_id, authorization), "read", key, write=False)
    size = await _size(request, key)
    wanted = parse_range(range_header, size)
    first, last = wanted if wanted is not None else (0, size - 1)
    headers = {"Content-Length": str(last - first + 1), "Accept-Ranges": "bytes"}
    if wanted is not None:
        headers["Content-Range"] = f"bytes {first}-{last}/{size}"
    store = request.app.state.platform.store
    return StreamingResponse(read_chunks(store, key, first, last - first + 1), status_code=206 if wanted else 200,
                             headers=headers, media_type="application/octet-stream")


@router.put("/{key:path}", status_code=201, response_model=ObjectWritten)
async def put_object(request: Request, job_id: str, key: str,
                     authorization: str | None = Header(default=None)) -> dict:
    """Writes the body to `key`, at most TUNEFORGE_TRAINER_OBJECT_MAX_BYTES."""
    key = check_key(await _grant(request, job_id, authorization), "write", key, write=True)
    platform = request.app.state.platform
    limit = platform.settings.trainer_object_max_bytes
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"an object written through the proxy is at most {limit} bytes",
                       "invalid_request_error", None, "object_too_large")
    written = await receive_into(platform.store, key, request.stream(), limit)
    return {"key": key, "size_bytes": written}


@router.delete("/{key:path}", status_code=204, response_class=Response)
async def delete_object(request: Request, job_id: str, key: str,
                        authorization: str | None = Header(default=None)) -> Response:
    key = check_key(await _grant(request, job_id, authorization), "delete", key, write=True)
    await run_in_threadpool(request.app.state.platform.store.delete, key)
    return Response(status_code=204)
