"""/tinker/api/v1 — the training API in Tinker's wire format, so that the official `tinker` SDK
works unchanged: `TINKER_BASE_URL=http://HOST:PORT/tinker TINKER_API_KEY=tml-<tenant key>`.

Routes and shapes: docs/training-api.md (and docs/tinker-wire.md for the wire itself). Every route
takes the tenant's key (the edge checks it before reading a body) and sees only the tenant's own
sessions, models, futures and checkpoints: anything else is 404. A refusal is a 400 with a JSON
body naming the field (never 409, which the SDK retries for minutes); a queue or model limit is
429 with Retry-After, which the SDK waits out.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse

from tuneforge.api import credentials, deps
from tuneforge.api.schemas.base import ObjectRoute
from tuneforge.api.schemas.tinker import (
    Accepted,
    Capabilities,
    Checkpoints,
    ClientConfig,
    CreatedSession,
    DynamicConfig,
    Heartbeat,
    ModelInfo,
    Nothing,
    PoolJobAnswer,
    PoolWork,
    SamplerInfo,
    SampleSubmitted,
    SamplingSession,
    SessionInfo,
    SessionList,
    Submitted,
    TrainingRun,
    TrainingRuns,
    WeightsInfo,
)
from tuneforge.domain.errors import invalid
from tuneforge.services.training_api import runs
from tuneforge.services.training_api.service import TrainingApi

router = APIRouter(prefix="/tinker/api/v1", tags=["training API"], include_in_schema=False, route_class=ObjectRoute)
POLL_S = 25.0  # a retrieve_future is held this long for its result (the SDK re-polls at once)

# what the SDK's /client/config may set; everything else keeps its default (docs/tinker-wire.md §2.1)
CLIENT_CONFIG = {"pjwt_auth_enabled": False, "credential_default_source": "api_key", "use_pyqwest_transport": False,
                 "proto_compress_fwdbwd": False, "parallel_fwdbwd_chunks": False, "fwdbwd_max_chunk_len": 1024,
                 "fwdbwd_max_chunk_bytes_count": 4_000_000, "sample_use_retrieve_futures": False,
                 "custom_loss_server_side": False, "sample_join_sampling_session": False}


async def tenant(request: Request) -> AsyncIterator[str]:
    """The caller's tenant id, admitted by its tier's request limits (the key: `X-API-Key: tml-<key>`)."""
    authorization = credentials.authorization_of(request.scope)
    async with deps.admitted_caller(request.app.state, request.scope, authorization) as found:
        request.app.state.training_api.api().broker.tiers[found.tenant_id] = found.tier
        yield found.tenant_id


TENANT = Depends(tenant)


def api(request: Request) -> TrainingApi:
    return request.app.state.training_api.api()


async def body_of(request: Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError:
        raise invalid("the body must be a JSON object", "body") from None
    if not isinstance(body, dict):
        raise invalid("the body must be a JSON object", "body")
    return body


@router.post("/client/config", response_model=ClientConfig)
async def client_config(tenant_id: str = TENANT) -> Any:
    return CLIENT_CONFIG


@router.post("/client/dynamic_config", response_model=DynamicConfig)
async def dynamic_config(tenant_id: str = TENANT) -> Any:
    return {"refresh_interval_sec": 300, "sample_cancel_enabled": True}


@router.post("/telemetry", response_model=Accepted)
async def telemetry(tenant_id: str = TENANT) -> Any:
    return {"status": "accepted"}  # the client's own view of its errors: not kept


@router.get("/get_server_capabilities", response_model=Capabilities)
async def capabilities(request: Request, tenant_id: str = TENANT) -> Any:
    return await api(request).capabilities()


@router.get("/healthz", response_model=Accepted)
async def healthz() -> Any:
    return {"status": "ok"}


# sessions ------------------------------------------------------------------------------------------------
@router.post("/create_session", response_model=CreatedSession)
async def create_session(request: Request, tenant_id: str = TENANT) -> Any:
    body = await body_of(request)
    tags = [str(tag) for tag in body.get("tags") or []][:32]
    metadata = {str(k): str(v) for k, v in (body.get("user_metadata") or {}).items()}
    session = api(request).broker.create_session(tenant_id, tags, metadata)
    return {"type": "create_session", "session_id": session.session_id}


@router.post("/session_heartbeat", response_model=Heartbeat)
async def heartbeat(request: Request, tenant_id: str = TENANT) -> Any:
    body = await body_of(request)
    api(request).broker.heartbeat(tenant_id, str(body.get("session_id")))
    return {"type": "session_heartbeat"}


@router.post("/sessions/{session_id}/finish", response_model=Nothing)
async def finish(session_id: str, request: Request, tenant_id: str = TENANT) -> Any:
    api(request).broker.finish(tenant_id, session_id)
    return {}


@router.get("/sessions/{session_id}", response_model=SessionInfo)
async def get_session(session_id: str, request: Request, tenant_id: str = TENANT) -> Any:
    session = api(request).broker.session(tenant_id, session_id)
    return {"training_run_ids": list(session.models), "sampler_ids": list(session.samplers),
            "user_metadata": session.user_metadata or None}


@router.get("/sessions", response_model=SessionList)
async def list_sessions(request: Request, limit: int = 20, offset: int = 0, tenant_id: str = TENANT) -> Any:
    own = [s.session_id for s in api(request).broker.sessions.values() if s.tenant == tenant_id]
    return {"sessions": own[max(offset, 0):max(offset, 0) + max(min(limit, 1000), 0)]}


# training ------------------------------------------------------------------------------------------------
@router.post("/create_model", response_model=Submitted)
async def create_model(request: Request, tenant_id: str = TENANT) -> Any:
    return await api(request).create_model(tenant_id, await body_of(request))


@router.post("/get_info", response_model=ModelInfo)
async def get_info(request: Request, tenant_id: str = TENANT) -> Any:
    body = await body_of(request)
    return await api(request).info(tenant_id, str(body.get("model_id")))


@router.post("/forward_backward", response_model=Submitted)
async def forward_backward(request: Request, tenant_id: str = TENANT) -> Any:
    if "zstd" in request.headers.get("content-encoding", ""):
        raise invalid("compressed bodies are not accepted; the client config asks for none", "content-encoding")
    return await api(request).forward_backward(tenant_id, await request.body())


@router.post("/optim_step", response_model=Submitted)
async def optim_step(request: Request, tenant_id: str = TENANT) -> Any:
    return await api(request).optim_step(tenant_id, await body_of(request))


@router.post("/save_weights", response_model=Submitted)
async def save_weights(request: Request, tenant_id: str = TENANT) -> Any:
    return await api(request).save_weights(tenant_id, await body_of(request), for_sampler=False)


@router.post("/save_weights_for_sampler", response_model=Submitted)
async def save_weights_for_sampler(request: Request, tenant_id: str = TENANT) -> Any:
    body = await body_of(request)
    if body.get("kind") not in (None, "snapshot"):
        raise invalid("only kind 'snapshot' is supported", "kind")
    return await api(request).save_weights(tenant_id, body, for_sampler=True)


@router.post("/load_weights", response_model=Submitted)
async def load_weights(request: Request, tenant_id: str = TENANT) -> Any:
    return await api(request).load_weights(tenant_id, await body_of(request))


# sampling ------------------------------------------------------------------------------------------------
@router.post("/create_sampling_session", response_model=SamplingSession)
async def create_sampling_session(request: Request, tenant_id: str = TENANT) -> Any:
    return await api(request).create_sampling_session(tenant_id, await body_of(request))


@router.get("/samplers/{sampler_id}", response_model=SamplerInfo)
async def get_sampler(sampler_id: str, request: Request, tenant_id: str = TENANT) -> Any:
    return api(request).sampler_info(tenant_id, sampler_id)


@router.post("/asample", response_model=SampleSubmitted)
async def asample(request: Request, tenant_id: str = TENANT) -> Any:
    return await api(request).sample(tenant_id, await body_of(request))


# the REST client: runs and checkpoints -----------------------------------------------------------------
@router.get("/training_runs", response_model=TrainingRuns)
async def list_training_runs(request: Request, limit: int = 20, offset: int = 0, tenant_id: str = TENANT) -> Any:
    return await api(request).rest(runs.training_runs, tenant_id, limit, offset)


@router.get("/training_runs/{run_id}", response_model=TrainingRun)
async def get_training_run(run_id: str, request: Request, tenant_id: str = TENANT) -> Any:
    return await api(request).training_run(tenant_id, run_id)


@router.get("/training_runs/{run_id}/checkpoints", response_model=Checkpoints)
async def list_checkpoints(run_id: str, request: Request, tenant_id: str = TENANT) -> Any:
    training = api(request)
    await training.rest(runs.run_record, tenant_id, run_id)  # 404 for a run that is not the caller's
    found = await training.rest(runs.checkpoints, tenant_id, run_id)
    return {"checkpoints": [runs.public_checkpoint(record) for record in found]}


@router.get("/checkpoints", response_model=Checkpoints)
async def list_user_checkpoints(request: Request, limit: int = 100, offset: int = 0, tenant_id: str = TENANT) -> Any:
    found = await api(request).rest(runs.checkpoints, tenant_id)
    limit, offset = max(0, min(limit, 1000)), max(0, offset)
    return {"checkpoints": [runs.public_checkpoint(record) for record in found[offset:offset + limit]],
            "cursor": {"offset": offset, "limit": limit, "total_count": len(found)}}


@router.delete("/training_runs/{run_id}/checkpoints/{checkpoint_id:path}", response_class=Response)
async def delete_checkpoint(run_id: str, checkpoint_id: str, request: Request, tenant_id: str = TENANT) -> Any:
    await api(request).rest(runs.delete_checkpoint, tenant_id, run_id, checkpoint_id)
    return Response(status_code=204)


@router.post("/weights_info", response_model=WeightsInfo)
async def weights_info(request: Request, tenant_id: str = TENANT) -> Any:
    body = await body_of(request)
    return await api(request).weights_info(tenant_id, body.get("tinker_path"))


# futures -------------------------------------------------------------------------------------------------
@router.post("/retrieve_future", response_class=Response)
async def retrieve_future(request: Request, tenant_id: str = TENANT) -> Any:
    body = await body_of(request)
    training = api(request)
    future = training.broker.future(tenant_id, str(body.get("request_id")))
    if not await training.broker.wait(future, POLL_S):
        return JSONResponse({"type": "try_again", "request_id": future.request_id, "queue_state": "active"})
    if future.error is not None:
        return JSONResponse({"error": future.error, "category": future.category})
    if isinstance(future.body, bytes):
        return Response(future.body, media_type=future.content_type)
    return JSONResponse(future.body)


@router.post("/cancel_future", response_model=Nothing)
async def cancel_future(request: Request, tenant_id: str = TENANT) -> Any:
    """A sampling request the client abandoned: dropped if it has not started (sample_cancel_enabled)."""
    body = await body_of(request)
    api(request).broker.cancel(tenant_id, str(body.get("request_id")))
    return {}


# the worker side: a co-training worker's results in, its next cycle out ----------------------------------
internal = APIRouter(prefix="/internal/v1/pools", include_in_schema=False, route_class=ObjectRoute)


@internal.post("/{pool_id}/work", response_model=PoolWork)
async def pool_work(pool_id: str, request: Request) -> Any:
    authorization = request.headers.get("authorization") or ""
    host = request.app.state.training_api
    training = host.api()
    pool = await host.pool(pool_id, authorization.partition(" ")[2].strip())
    return await training.work(pool, await body_of(request))


@internal.post("/jobs/{job_id}/{action}", response_model=PoolJobAnswer)
async def pool_job(job_id: str, action: str, request: Request) -> Any:
    """A step of an ordinary job that trains on the shared pool (its attempt's job token)."""
    token = (request.headers.get("authorization") or "").partition(" ")[2].strip()
    return await request.app.state.training_api.job_clients().handle(job_id, action, token, await body_of(request))
