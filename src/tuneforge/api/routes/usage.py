"""/v1/usage — the calling tenant's metered GPU time in a month, job by job, and its metered tokens (extension)."""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends, Query

from tuneforge.api import deps
from tuneforge.api.limits import MONTH_PATTERN
from tuneforge.api.schemas.base import ObjectRoute
from tuneforge.api.schemas.usage import UsageReport
from tuneforge.db import Session
from tuneforge.db.tables import Tenant
from tuneforge.services.context import Platform
from tuneforge.services.tenancy import quotas, usage

router = APIRouter(prefix="/v1/usage", tags=["usage"], route_class=ObjectRoute)


def usage_job_object(row: usage.JobUsage) -> dict:
    return {
        "object": "usage.job",
        "job_id": row.job_id,
        "model": row.model,
        "status": row.status,
        "gpu_seconds": round(row.metered.gpu_seconds, 3),
        "billable_gpu_seconds": round(row.metered.billable_gpu_seconds, 3),
        "refunded_gpu_seconds": round(row.metered.refunded_gpu_seconds, 3),
        "attempts": row.metered.attempts,
        # what the billed GPU time cost at each attempt's pool price, and what it would have on demand
        "cost": round(row.metered.cost, 4),
        "on_demand_cost": round(row.metered.on_demand_cost, 4),
        "saving": round(row.metered.saving, 4),
    }


@router.get("", response_model=UsageReport)
def get_usage(month: str | None = Query(None, pattern=MONTH_PATTERN, description="YYYY-MM (UTC), 1970-01 on; "
                                                                                 "default this month."),
              tenant: Tenant = Depends(deps.tenant),
              session: Session = deps.SESSION, platform: Platform = Depends(deps.platform)) -> dict:
    """GPU-seconds per job in `month` (YYYY-MM, UTC; default this month): attempts from launch to end,
    queue time free, platform failures refunded; totals in GPU-hours against the tenant's allowance;
    `storage`: what it keeps now against its storage quotas; `tokens`: the tokens its graders' judges spent,
    per kind, model and job, at the price per million of each kind."""
    now = time.time()
    month = usage.parse_month(month) if month is not None else usage.current_month(now)
    rows = usage.jobs_usage(session, tenant.tenant_id, month, now)
    return {
        "object": "list",
        "data": [usage_job_object(row) for row in rows],
        "has_more": False,
        "totals": quotas.month_totals(session, tenant, month, now),
        "storage": quotas.storage_standing(session, platform.settings, platform.store, tenant, now),
        "tokens": usage.tokens_usage(session, platform.settings, tenant.tenant_id, month),
    }
