"""/internal/v1 — reports from trainer attempts, authenticated by job token."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Depends, Header, Query
from pydantic import ValidationError
from sqlalchemy.orm import Session

from tuneforge.api import deps
from tuneforge.domain.errors import invalid
from tuneforge.domain.reports import REPORT_TYPES, Report
from tuneforge.services import reports
from tuneforge.services.context import Platform

router = APIRouter(prefix="/internal/v1/jobs/{job_id}", tags=["internal"], include_in_schema=False)


@router.get("/credentials")
def credentials(
    job_id: str,
    attempt: int = Query(ge=1, le=2**31),
    authorization: str | None = Header(default=None),
    session: Session = deps.SESSION,
    platform: Platform = Depends(deps.platform),
) -> dict:
    """The secrets and operator endpoints the attempt's eval config names, for that attempt only."""
    job, current = reports.authorize(session, job_id, attempt, authorization)
    return reports.credentials(session, platform, job, current)


@router.post("/{kind}")
def report(
    job_id: str,
    kind: str,
    body: dict[str, Any] = Body(...),
    authorization: str | None = Header(default=None),
    session: Session = deps.SESSION,
    platform: Platform = Depends(deps.platform),
) -> dict:
    message = _parse(kind, body)
    job, attempt = reports.authorize(session, job_id, message.attempt, authorization)
    return reports.apply(session, platform.store, job, attempt, message)


def _parse(kind: str, body: dict[str, Any]) -> Report:
    """The typed message of a `kind` report; 400 naming the field it lacks or gets wrong."""
    if kind not in REPORT_TYPES:
        raise invalid(f"unknown report kind {kind!r}", param="kind")
    try:
        return REPORT_TYPES[kind].model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or None
        raise invalid(f"invalid {kind} report: {where or 'body'}: {first['msg']}", param=where) from None
