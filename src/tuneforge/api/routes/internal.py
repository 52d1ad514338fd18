"""/internal/v1 — reports from trainer attempts, their credentials and their graders' judges, authenticated
by job token."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Depends, Header, Query

from tuneforge.api import deps
from tuneforge.api.schemas.base import ObjectRoute
from tuneforge.api.schemas.internal import AttemptCredentials, JudgeAnswer, ReportAnswer
from tuneforge.db import Session
from tuneforge.domain import reports as domain_reports
from tuneforge.domain.errors import ApiError, invalid
from tuneforge.services.context import Platform
from tuneforge.services.training import reports

# answers that tell the trainer its attempt is over (stale or unknown token), not that a report was refused
FENCING_STATUSES = (401, 409)
router = APIRouter(prefix="/internal/v1/jobs/{job_id}", tags=["internal"], include_in_schema=False,
                   route_class=ObjectRoute)


@router.get("/credentials", response_model=AttemptCredentials)
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


@router.post("/judge", response_model=JudgeAnswer)
def judge(
    job_id: str,
    body: dict[str, Any] = Body(...),
    authorization: str | None = Header(default=None),
    session: Session = deps.SESSION,
    platform: Platform = Depends(deps.platform),
) -> dict:
    """The answers of the judge the job's model grader names, to the attempt's conversations
    (services/serving/judges.py; the tokens are metered to the job)."""
    job, attempt = reports.authorize(session, job_id, _attempt_number(body), authorization)
    return reports.judge(session, platform, job, attempt, body)


@router.post("/{kind}", response_model=ReportAnswer)
def report(
    job_id: str,
    kind: str,
    body: dict[str, Any] = Body(...),
    authorization: str | None = Header(default=None),
    session: Session = deps.SESSION,
    platform: Platform = Depends(deps.platform),
) -> dict:
    """One report of the current attempt. The token is checked before the body is parsed, so a
    refusal is only ever logged for a real attempt (`reports.refused`)."""
    job, attempt = reports.authorize(session, job_id, _attempt_number(body), authorization)
    try:
        message = domain_reports.parse(kind, body)
        return reports.apply(session, platform.store, job, attempt, message)
    except domain_reports.InvalidReport as exc:
        raise reports.refused(job, attempt, kind, invalid(str(exc), param=exc.param, code="invalid_report")) from None
    except ApiError as exc:
        if exc.status_code in FENCING_STATUSES or exc.status_code >= 500:
            raise
        raise reports.refused(job, attempt, kind, exc) from None


def _attempt_number(body: dict[str, Any]) -> int:
    number = body.get("attempt")
    if not isinstance(number, int) or isinstance(number, bool) or not 1 <= number <= 2**31:
        raise invalid("a report must carry its attempt number ('attempt', an integer from 1)", param="attempt")
    return number
