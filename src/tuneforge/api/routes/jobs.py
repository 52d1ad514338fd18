"""/v1/fine_tuning/jobs — OpenAI's fine-tuning API plus downloads."""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator
from contextlib import aclosing

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import Response, StreamingResponse
from sse_starlette import ServerSentEvent
from starlette.background import BackgroundTask

from tuneforge.api import deps, sse
from tuneforge.api.headers import attachment
from tuneforge.api.hot_path import job_answer
from tuneforge.api.limits import MAX_ID_CHARS, MAX_NAME_CHARS
from tuneforge.api.objects import checkpoint_object, event_object, job_object, list_object
from tuneforge.api.openapi import binary_body, error_responses, event_stream
from tuneforge.api.schemas.base import ObjectRoute
from tuneforge.api.schemas.jobs import (
    FineTuningJob,
    FineTuningJobCheckpointList,
    FineTuningJobEvent,
    FineTuningJobEventList,
    FineTuningJobList,
    JobAttemptList,
    JobEstimate,
    JobExport,
    JobValidation,
    PriceEstimate,
)
from tuneforge.db import Session
from tuneforge.db.tables import Tenant
from tuneforge.domain.job_config import JobRequest
from tuneforge.services.context import Platform
from tuneforge.services.datasets import checks as datasets
from tuneforge.services.tenancy import usage
from tuneforge.services.training import artifacts, event_streams, job_export, trainer_logs
from tuneforge.services.training import jobs as job_service

router = APIRouter(prefix="/v1/fine_tuning/jobs", tags=["fine-tuning"], route_class=ObjectRoute)
together_router = APIRouter(prefix="/v1/fine-tunes", tags=["fine-tuning"], route_class=ObjectRoute)
_METADATA_PARAM = re.compile(r"^metadata\[(.+)\]$")
_EVENTS_STREAMED = ("A page of events, newest first; with stream=true, Server-Sent Events: each event, "
                    "oldest first, then `data: [DONE]` once the job has finished.")


# First of the router's routes: the most polled one is matched first. No other route of a single
# segment answers GET (its `{job_id}` matches neither "" nor a path with more segments).
@router.get("/{job_id}", response_model=FineTuningJob, openapi_extra=deps.lean_parameters("job_id"))
async def retrieve_job(request: Request) -> Response:
    """Answered by api/hot_path.HotPath before the app; here when it hands a request over."""
    body = await job_answer(request.app.state, request.scope, request.path_params["job_id"])
    return Response(body, media_type="application/json")


@router.post("", response_model=FineTuningJob, responses=error_responses(403, 409, 429))
async def create_job(
    body: JobRequest,
    request: Request,
    idempotency_key: str | None = Header(default=None, alias="Idempotency-Key", max_length=MAX_NAME_CHARS),
    tenant: Tenant = deps.TENANT,
) -> Response:
    platform = request.app.state.platform
    return deps.json_response(await deps.in_unit_of_work(
        request, lambda session: job_object(job_service.submit_job(session, platform, tenant, body, idempotency_key),
                                            platform.settings.openai_strict_status)))


@router.post("/estimate", response_model=JobEstimate)
def estimate_job(
    body: JobRequest,
    tenant: Tenant = Depends(deps.tenant),
    session: Session = deps.SESSION,
    platform: Platform = Depends(deps.platform),
) -> dict:
    """Extension: tokens, steps, GPU-hours, price and queue position for this body; creates nothing."""
    return job_service.estimate_job(session, platform, tenant, body)


@together_router.post("/estimate-price", response_model=PriceEstimate)
def estimate_price(
    body: JobRequest,
    tenant: Tenant = Depends(deps.tenant),
    session: Session = deps.SESSION,
    platform: Platform = Depends(deps.platform),
) -> dict:
    """Together's name for the estimate: the same body and figures, plus Together's field names."""
    estimate = job_service.estimate_job(session, platform, tenant, body)
    return {**estimate, **job_service.together_price_fields(session, tenant, estimate)}


@router.get("", response_model=FineTuningJobList, openapi_extra=deps.lean_parameters())
async def list_jobs(
    request: Request,
    after: str | None = Query(default=None, max_length=MAX_ID_CHARS),
    limit: int = Query(default=20, ge=1, le=100),
) -> Response:
    metadata = {}
    for key, value in request.query_params.multi_items():
        match = _METADATA_PARAM.match(key)
        if match:
            metadata[match.group(1)] = value
    async with deps.admitted(request) as caller:
        if metadata:  # filtered pages are rare: the plain path
            strict = request.app.state.platform.settings.openai_strict_status
            return deps.json_response(await deps.in_unit_of_work(request, _job_page, caller.tenant_id, metadata,
                                                                 after, limit, strict))
        body = await request.app.state.job_bodies.page(caller.tenant_id, after, limit)
    return Response(body, media_type="application/json")


def _job_page(session: Session, tenant_id: str, metadata: dict[str, str], after: str | None, limit: int,
              strict: bool) -> dict:
    page = job_service.list_jobs(session, tenant_id, metadata=metadata, after=after, limit=limit)
    return list_object(page.rows, lambda job: job_object(job, strict), page.has_more)


@router.post("/{job_id}/cancel", response_model=FineTuningJob)
def cancel_job(job_id: str, tenant: Tenant = Depends(deps.tenant), session: Session = deps.SESSION,
               platform: Platform = Depends(deps.platform)) -> dict:
    """Stops the job; its checkpoints are removed unless `checkpointing.keep_on_cancel`."""
    job = job_service.cancel_job(session, tenant.tenant_id, job_id, platform.store)
    return job_object(job, platform.settings.openai_strict_status)


@router.post("/{job_id}/pause", response_model=FineTuningJob)
def pause_job(job_id: str, tenant: Tenant = Depends(deps.tenant), session: Session = deps.SESSION,
              platform: Platform = Depends(deps.platform)) -> dict:
    """A running job checkpoints and stops (status `pausing`, then `paused` once it has); a queued one
    pauses at once; an evaluating one cannot (its training is done)."""
    job = job_service.pause_job(session, tenant.tenant_id, job_id)
    return job_object(job, platform.settings.openai_strict_status)


@router.post("/{job_id}/resume", response_model=FineTuningJob)
def resume_job(job_id: str, tenant: Tenant = Depends(deps.tenant), session: Session = deps.SESSION,
               platform: Platform = Depends(deps.platform)) -> dict:
    """A paused job is queued again and continues from its newest checkpoint."""
    job = job_service.resume_job(session, tenant.tenant_id, job_id, platform.settings, platform.store)
    return job_object(job, platform.settings.openai_strict_status)


@router.get("/{job_id}/events", response_model=FineTuningJobEventList,
            responses={**error_responses(429), **event_stream(FineTuningJobEvent, _EVENTS_STREAMED)},
            openapi_extra=deps.lean_parameters())
async def list_events(
    job_id: str,
    request: Request,
    after: str | None = Query(default=None, max_length=MAX_ID_CHARS),
    limit: int = Query(default=20, ge=1, le=100),
    stream: bool = Query(default=False, description="Server-Sent Events: every event oldest first (or those "
                                                     "after Last-Event-ID), then new ones as they come, then "
                                                     "`data: [DONE]` once the job has finished."),
    last_event_id: str | None = Header(default=None, alias="Last-Event-ID", max_length=MAX_ID_CHARS,
                                       description="With stream=true: resume after this event."),
) -> Response:
    platform: Platform = request.app.state.platform
    # an open stream counts against the streams bound, not the tenant's requests in flight: the
    # request's slot comes back when this block ends, before the stream starts
    async with deps.admitted(request) as caller:
        if stream:
            after_pk = await deps.in_unit_of_work(request, event_streams.start_point, caller.tenant_id, job_id,
                                                  last_event_id)
            opened = event_streams.open_stream(platform, caller.tenant_id, job_id, after_pk)
            return sse.response(_event_frames(platform, opened), keepalive_s=platform.settings.stream_keepalive_s,
                                # the stream's slot also comes back should the stream never have started
                                background=BackgroundTask(opened.slot.release))
        body = await request.app.state.event_pages.page(caller.tenant_id, job_id, after, limit)
    if body is None:
        raise job_service.not_found_job(job_id)
    return Response(body, media_type="application/json")


async def _event_frames(platform: Platform, opened: event_streams.OpenStream) -> AsyncIterator[ServerSentEvent]:
    """Each event with its id (what Last-Event-ID resumes after), then `data: [DONE]` once the job
    has finished; a stream cut short by the server's shutdown ends without it."""
    async with aclosing(event_streams.follow(platform, opened)) as events:
        async for event in events:
            yield sse.message(json.dumps(event_object(event)), event_id=event.event_id)
    if not platform.streams.closing:
        yield sse.message(sse.DONE)


@router.get("/{job_id}/export", response_model=JobExport)
def export_job(
    job_id: str,
    tenant: Tenant = Depends(deps.tenant),
    session: Session = deps.SESSION,
) -> dict:
    """Extension: the create body that re-runs this job exactly (every chosen value explicit, and a
    `lock` with the base model's and the data's SHA-256, checked when it is posted)."""
    return job_export.export(session, job_service.get_job(session, tenant.tenant_id, job_id))


@router.get("/{job_id}/validation", response_model=JobValidation)
def job_validation(
    job_id: str,
    tenant: Tenant = Depends(deps.tenant),
    session: Session = deps.SESSION,
    platform: Platform = Depends(deps.platform),
) -> dict:
    """Extension: the data report of the job's validation against its base model."""
    job = job_service.get_job(session, tenant.tenant_id, job_id)
    report = datasets.job_report(platform.store, job.tenant_id, job.job_id)
    return {"object": "fine_tuning.job.validation", "job_id": job.job_id, **report}


@router.get("/{job_id}/checkpoints", response_model=FineTuningJobCheckpointList)
def list_checkpoints(
    job_id: str,
    after: str | None = Query(default=None, max_length=MAX_ID_CHARS),
    limit: int = Query(default=10, ge=1, le=100),
    tenant: Tenant = Depends(deps.tenant),
    session: Session = deps.SESSION,
) -> dict:
    job = job_service.get_job(session, tenant.tenant_id, job_id)
    page = job_service.list_checkpoints(session, job, after=after, limit=limit)
    return list_object(page.rows, lambda row: checkpoint_object(row, job, tenant.name), page.has_more)


@router.get("/{job_id}/download", response_class=StreamingResponse,
            responses={**binary_body("application/gzip", "The artifact as a .tar.gz archive."),
                       **error_responses(409)})
def download(
    job_id: str,
    artifact: str | None = Query(default=None, max_length=MAX_NAME_CHARS),
    # checkpoints.step is a 32-bit column
    step: int | None = Query(default=None, ge=0, le=2**31 - 1),
    dtype: str | None = Query(default=None, max_length=MAX_NAME_CHARS,
                              description="artifact=merged: bf16 (default), fp16 or fp32"),
    tenant: Tenant = Depends(deps.tenant),
    session: Session = deps.SESSION,
    platform: Platform = Depends(deps.platform),
) -> Response:
    job = job_service.get_job(session, tenant.tenant_id, job_id)
    name, archive = artifacts.adapter_archive(session, platform, job, artifact=artifact, step=step, dtype=dtype)
    return StreamingResponse(
        artifacts.iter_file(archive), media_type="application/gzip",
        headers={"Content-Disposition": attachment(name)},
    )


@router.get("/{job_id}/logs", response_class=StreamingResponse,
            responses={**binary_body("text/plain", "The trainer's output, newest lines last (X-Attempt: whose)."),
                       **error_responses(429)})
def job_logs(
    job_id: str,
    attempt: int | None = Query(default=None, ge=1, le=2**31 - 1, description="Default: the newest attempt."),
    limit: int = Query(default=1000, ge=1, le=trainer_logs.MAX_LINES, description="The newest this many lines."),
    max_bytes: int = Query(default=256 * 1024, ge=1, le=trainer_logs.LOG_KEEP_BYTES,
                           description="At most this many bytes (whole lines)."),
    follow: bool = Query(default=False, description="Keep the answer open and send new lines as they come, "
                                                   "until the job has ended."),
    tenant: Tenant = Depends(deps.tenant),
    session: Session = deps.SESSION,
    platform: Platform = Depends(deps.platform),
) -> Response:
    """Extension: the output of the job's trainer (its newest MiB per attempt is kept), with the
    platform's paths and credentials scrubbed; `follow=true` streams it as plain text while the job runs."""
    view = trainer_logs.read(session, platform.store, tenant.tenant_id, job_id, attempt=attempt, limit=limit,
                             max_bytes=max_bytes)
    headers = {"X-Attempt": str(view.attempt), "Cache-Control": "no-store"}
    if not follow:
        return Response(view.text, media_type="text/plain; charset=utf-8", headers=headers)
    slot = platform.streams.acquire(tenant.tenant_id, job_id)  # a follower counts as one of its event streams
    follower = trainer_logs.Follower(tenant.tenant_id, job_id, view.attempt, pinned=attempt is not None)
    lines = trainer_logs.follow(platform.db.session, platform.store, view, follower,
                                closing=lambda: platform.streams.closing, release=slot.release)
    return StreamingResponse(lines, media_type="text/plain; charset=utf-8",
                             headers={**headers, "X-Accel-Buffering": "no"}, background=BackgroundTask(slot.release))


@router.get("/{job_id}/attempts", response_model=JobAttemptList)
def list_attempts(job_id: str, tenant: Tenant = Depends(deps.tenant), session: Session = deps.SESSION) -> dict:
    """Extension: every attempt of the job, with how it ended and why (failure_class: platform failures are
    retried and not billed, user errors are not retried)."""
    rows = job_service.list_attempts(session, tenant.tenant_id, job_id)
    now = time.time()
    total, data = usage.Metered(), []
    for a in rows:
        metered = usage.Metered()
        metered.add(a, now, float("-inf"), float("inf"))
        total.add(a, now, float("-inf"), float("inf"))
        price, _on_demand = usage.attempt_prices(a)
        data.append({"object": "fine_tuning.job.attempt", "number": a.number, "status": a.status,
                     "exit_code": a.exit_code, "failure_class": a.failure_class, "gpus": a.gpus,
                     "started_at": a.started_at, "ended_at": a.ended_at,
                     "pool": (a.placement or {}).get("pool") or None, "price_per_gpu_hour": price,
                     "cost": round(metered.cost, 4)})
    # the job so far: its billed attempts at their pools' prices, against the same GPU time on demand
    return {"object": "list", "has_more": False, "data": data,
            "cost": {"so_far": round(total.cost, 4), "on_demand": round(total.on_demand_cost, 4),
                     "saving": round(total.saving, 4)}}
