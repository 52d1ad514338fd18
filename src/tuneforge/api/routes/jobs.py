"""/v1/fine_tuning/jobs — OpenAI's fine-tuning API plus downloads."""

from __future__ import annotations

import json
import logging
import re
import time
from typing import Iterator

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import Response, StreamingResponse
from sqlalchemy.orm import Session

from tuneforge.api import deps
from tuneforge.api.objects import checkpoint_object, event_object, job_object, list_object
from tuneforge.db.engine import savepoint
from tuneforge.db.repos import attempts as attempt_repo
from tuneforge.db.repos import checkpoints as checkpoint_repo
from tuneforge.db.repos import events as event_repo
from tuneforge.db.repos import files as file_repo
from tuneforge.db.repos import jobs as job_repo
from tuneforge.db.tables import Job, Tenant
from tuneforge.domain.errors import invalid
from tuneforge.domain.job_config import JobRequest
from tuneforge.domain.status import JobStatus, TERMINAL
from tuneforge.services import artifacts, datasets
from tuneforge.services import jobs as job_service
from tuneforge.executors.local import local_inventory
from tuneforge.scheduler.policy import PolicyConfig
from tuneforge.scheduler.queue_view import queue_view
from tuneforge.scheduler.validation import validate_job
from tuneforge.services.context import Platform

router = APIRouter(prefix="/v1/fine_tuning/jobs", tags=["fine-tuning"])
_METADATA_PARAM = re.compile(r"^metadata\[(.+)\]$")
STREAM_POLL_S = 0.5
_log = logging.getLogger(__name__)


@router.post("")
def create_job(
    body: JobRequest,
    idempotency_key: str | None = Header(default=None, alias="Idempotency-Key"),
    tenant: Tenant = Depends(deps.tenant),
    session: Session = deps.SESSION,
    platform: Platform = Depends(deps.platform),
) -> dict:
    if idempotency_key is not None and not (1 <= len(idempotency_key) <= 255):
        raise invalid("Idempotency-Key must be 1-255 characters", param="Idempotency-Key")
    job, created = job_service.create_job(session, platform.settings, tenant, body, idempotency_key)
    if created:
        _validate_small_job(session, platform, job)
    return job_object(job)


def _validate_small_job(session: Session, platform: Platform, job: Job) -> None:
    """Validate a job with small files now, in the create request's transaction
    (the scheduler cannot see the job before it commits), so the job comes
    back queued with its estimate, or failed with the data error."""
    files = [file_id for file_id in (job.training_file, job.validation_file) if file_id]
    size = sum(row.size_bytes for file_id in files if (row := file_repo.get(session, job.tenant_id, file_id)))
    if size > platform.settings.inline_validation_max_bytes:
        return
    try:
        with savepoint(session):
            validate_job(session, platform, job)
    except Exception:  # noqa: BLE001 - e.g. a tokenizer that fails to load: the scheduler retries and reports
        _log.exception("inline validation of %s failed; the scheduler will validate it", job.job_id)
        session.refresh(job)


@router.post("/estimate")
def estimate_job(
    body: JobRequest,
    tenant: Tenant = Depends(deps.tenant),
    session: Session = deps.SESSION,
    platform: Platform = Depends(deps.platform),
) -> dict:
    """Extension: tokens, steps, GPU-hours, price and queue position for this body; creates nothing."""
    return job_service.estimate_job(session, platform, tenant, body)


@router.get("")
def list_jobs(
    request: Request,
    after: str | None = None,
    limit: int = Query(default=20, ge=1, le=100),
    tenant: Tenant = Depends(deps.tenant),
    session: Session = deps.SESSION,
) -> dict:
    metadata = {}
    for key, value in request.query_params.multi_items():
        match = _METADATA_PARAM.match(key)
        if match:
            metadata[match.group(1)] = value
    page = job_service.list_jobs(session, tenant.tenant_id, metadata=metadata, after=after, limit=limit)
    return list_object(page.rows, job_object, page.has_more)


@router.get("/{job_id}")
def retrieve_job(job_id: str, tenant: Tenant = Depends(deps.tenant), session: Session = deps.SESSION,
                 platform: Platform = Depends(deps.platform)) -> dict:
    job = job_service.get_job(session, tenant.tenant_id, job_id)
    body = job_object(job)
    if job.status == JobStatus.QUEUED.value:
        body["queue"] = queue_place(session, platform, job.job_id)
    return body


def queue_place(session: Session, platform: Platform, job_id: str) -> dict | None:
    """Extension: the job's position in the scheduling order and its estimated start (epoch seconds)."""
    capacity = platform.inventory or local_inventory(platform.settings)
    policy = PolicyConfig(aging_s=platform.settings.scheduler_aging_s)
    for entry in queue_view(session, capacity, policy, time.time()):
        if entry.job_id == job_id:
            start = None if entry.estimated_start is None else int(entry.estimated_start)
            return {"position": entry.position, "estimated_start": start}
    return None  # waiting out a retry backoff


@router.post("/{job_id}/cancel")
def cancel_job(job_id: str, tenant: Tenant = Depends(deps.tenant), session: Session = deps.SESSION,
               platform: Platform = Depends(deps.platform)) -> dict:
    """Stops the job; its checkpoints are removed unless `checkpointing.keep_on_cancel`."""
    return job_object(job_service.cancel_job(session, tenant.tenant_id, job_id, platform.store))


@router.post("/{job_id}/pause")
def pause_job(job_id: str, tenant: Tenant = Depends(deps.tenant), session: Session = deps.SESSION) -> dict:
    """A running job checkpoints and stops (status `paused` once it has); a queued one pauses at once."""
    return job_object(job_service.pause_job(session, tenant.tenant_id, job_id))


@router.post("/{job_id}/resume")
def resume_job(job_id: str, tenant: Tenant = Depends(deps.tenant), session: Session = deps.SESSION) -> dict:
    """A paused job is queued again and continues from its newest checkpoint."""
    return job_object(job_service.resume_job(session, tenant.tenant_id, job_id))


@router.get("/{job_id}/events", response_model=None)
def list_events(
    job_id: str,
    after: str | None = None,
    limit: int = Query(default=20, ge=1, le=100),
    stream: bool = False,
    tenant: Tenant = Depends(deps.tenant),
    session: Session = deps.SESSION,
    platform: Platform = Depends(deps.platform),
) -> dict | StreamingResponse:
    job = job_service.get_job(session, tenant.tenant_id, job_id)
    if stream:
        return StreamingResponse(_event_stream(platform, job.job_id), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    page = event_repo.page(session, job.job_id, after=after, limit=limit)
    return list_object(page.rows, event_object, page.has_more)


def _event_stream(platform: Platform, job_id: str) -> Iterator[bytes]:
    """Server-Sent Events: every event oldest first, then new ones as they come,
    then `data: [DONE]` once the job has finished."""
    last_pk = 0
    while True:
        with platform.db.session() as session:
            batch = event_repo.since(session, job_id, last_pk)
            status = job_repo.status_of(session, job_id) if not batch else None
            finished = status is not None and JobStatus(status) in TERMINAL
        for event in batch:
            last_pk = event.pk
            yield f"data: {json.dumps(event_object(event))}\n\n".encode()
        if finished:
            yield b"data: [DONE]\n\n"
            return
        if not batch:
            yield b": keep-alive\n\n"
            time.sleep(STREAM_POLL_S)


@router.get("/{job_id}/validation")
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


@router.get("/{job_id}/checkpoints")
def list_checkpoints(
    job_id: str,
    after: str | None = None,
    limit: int = Query(default=10, ge=1, le=100),
    tenant: Tenant = Depends(deps.tenant),
    session: Session = deps.SESSION,
) -> dict:
    job = job_service.get_job(session, tenant.tenant_id, job_id)
    page = checkpoint_repo.page(session, job.job_id, after=after, limit=limit)
    return list_object(page.rows, lambda row: checkpoint_object(row, job), page.has_more)


@router.get("/{job_id}/download")
def download(
    job_id: str,
    artifact: str | None = None,
    step: int | None = Query(default=None, ge=0),
    dtype: str | None = Query(default=None, description="artifact=merged: bf16 (default), fp16 or fp32"),
    tenant: Tenant = Depends(deps.tenant),
    session: Session = deps.SESSION,
    platform: Platform = Depends(deps.platform),
) -> Response:
    job = job_service.get_job(session, tenant.tenant_id, job_id)
    name, archive = artifacts.adapter_archive(session, platform.store, job, artifact=artifact, step=step,
                                              dtype=dtype, cache_dir=platform.settings.home / "cache" / "base-models")
    return StreamingResponse(
        artifacts.iter_file(archive), media_type="application/gzip",
        headers={"Content-Disposition": f'attachment; filename="{name}"'},
    )


@router.get("/{job_id}/attempts")
def list_attempts(job_id: str, tenant: Tenant = Depends(deps.tenant), session: Session = deps.SESSION) -> dict:
    """Extension: every attempt of the job, with how it ended and why (failure_class: platform failures are
    retried and not billed, user errors are not retried)."""
    job = job_service.get_job(session, tenant.tenant_id, job_id)
    rows = attempt_repo.for_job(session, job.job_id)
    return {"object": "list", "has_more": False, "data": [
        {"object": "fine_tuning.job.attempt", "number": a.number, "status": a.status, "exit_code": a.exit_code,
         "failure_class": a.failure_class, "gpus": a.gpus, "started_at": a.started_at, "ended_at": a.ended_at}
        for a in rows]}
