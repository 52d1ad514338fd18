"""/internal/v1 — reports from trainer attempts, authenticated by job token."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Depends, Header
from sqlalchemy.orm import Session

from tuneforge.api import deps
from tuneforge.domain.errors import invalid
from tuneforge.services import reports
from tuneforge.services.context import Platform

router = APIRouter(prefix="/internal/v1/jobs/{job_id}", tags=["internal"], include_in_schema=False)


def _attempt(body: dict[str, Any]) -> int:
    try:
        return int(body["attempt"])
    except (KeyError, TypeError, ValueError):
        raise invalid("'attempt' is required and must be an integer", param="attempt") from None


@router.post("/{kind}")
def report(
    job_id: str,
    kind: str,
    body: dict[str, Any] = Body(...),
    authorization: str | None = Header(default=None),
    session: Session = deps.SESSION,
    platform: Platform = Depends(deps.platform),
) -> dict:
    job, attempt = reports.authorize(session, job_id, _attempt(body), authorization)
    if kind == "heartbeat":
        return reports.heartbeat(session, job, attempt, body)
    if kind == "events":
        return {"applied": reports.add_events(session, job, attempt, body)}
    if kind == "checkpoints":
        reports.add_checkpoint(session, job, attempt, body)
    elif kind == "resumed":
        return {"recovered_steps": reports.resumed(session, platform.store, job, attempt, body)}
    elif kind == "evaluating":
        reports.evaluating(session, job, attempt, body)
    elif kind == "result":
        reports.complete(session, platform.store, job, attempt, body)
    elif kind == "failure":
        reports.fail(session, job, attempt, body)
    else:
        raise invalid(f"unknown report kind {kind!r}", param="kind")
    return {"ok": True}
