"""/v1/fine_tuning/alpha/graders — run or validate a grader (OpenAI's alpha API), before training with it."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends

from tuneforge.api import deps
from tuneforge.api.schemas.base import ObjectRoute
from tuneforge.api.schemas.graders import GraderRunBody, GraderRunResult, GraderValidateBody, GraderValidateResult
from tuneforge.db.tables import Tenant
from tuneforge.services.context import Platform
from tuneforge.services.training import graders

router = APIRouter(prefix="/v1/fine_tuning/alpha/graders", tags=["graders"], route_class=ObjectRoute)
TENANT = Depends(deps.tenant)


@router.post("/run", response_model=GraderRunResult)
def run_grader(body: GraderRunBody, tenant: Tenant = TENANT, platform: Platform = Depends(deps.platform)) -> Any:
    """Score one model sample against one item with a grader: the reward and OpenAI's metadata."""
    return graders.run(platform, tenant, body.grader, body.model_sample, body.item)


@router.post("/validate", response_model=GraderValidateResult)
def validate_grader(body: GraderValidateBody, tenant: Tenant = TENANT,
                    platform: Platform = Depends(deps.platform)) -> Any:
    """Check a grader without running it: the grader back, or a 400 naming the field."""
    return graders.validate(platform, tenant, body.grader)
