"""/metrics — Prometheus' scrape endpoint (tuneforge/prometheus.py says what it holds).

No authentication, as with most exporters: it shows counts, GPU figures and latencies, never a
tenant's name or data. Bind the API to a private address, or filter the path at the proxy,
where that matters.
"""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends
from fastapi.responses import Response

from tuneforge import prometheus
from tuneforge.api import deps
from tuneforge.db import Session
from tuneforge.domain.vocab import TIERS
from tuneforge.services.context import Platform
from tuneforge.services.tenancy import usage

router = APIRouter(tags=["metrics"])


@router.get("/metrics", include_in_schema=False, response_class=Response,
            responses={200: {"description": "The exposition (Prometheus text format).",
                             "content": {prometheus.CONTENT_TYPE: {"schema": {"type": "string"}}}}})
def metrics(session: Session = deps.SESSION, platform: Platform = Depends(deps.platform)) -> Response:
    now = time.time()
    snap = usage.platform_snapshot(session, platform, TIERS, now)
    return Response(prometheus.exposition(snap, usage.counters(session, now)), media_type=prometheus.CONTENT_TYPE)
