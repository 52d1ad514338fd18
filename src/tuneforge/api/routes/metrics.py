"""/metrics — the platform's gauges in Prometheus' text format (version 0.0.4).

No authentication, as with most exporters: it shows counts and GPU figures,
never a tenant's name or data. Bind the API to a private address, or filter
the path at the proxy, where that matters.

The format is small enough to write directly: `# HELP` and `# TYPE` per
family, then one `name{label="value"} number` line per sample.
"""

from __future__ import annotations

import math
import time

from fastapi import APIRouter, Depends
from fastapi.responses import Response
from sqlalchemy.orm import Session

from tuneforge.api import deps
from tuneforge.services import usage
from tuneforge.services.context import Platform
from tuneforge.services.tenants import TIERS

router = APIRouter(tags=["metrics"])
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

Sample = tuple[dict[str, str], float]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def family(name: str, kind: str, help_text: str, samples: list[Sample]) -> list[str]:
    """One metric family: its HELP and TYPE lines, then a line per sample."""
    escaped_help = help_text.replace("\\", "\\\\").replace("\n", "\\n")
    lines = [f"# HELP {name} {escaped_help}", f"# TYPE {name} {kind}"]
    for labels, value in samples:
        label_text = ",".join(f'{key}="{_escape(str(val))}"' for key, val in labels.items())
        lines.append(f"{name}{{{label_text}}} {_number(value)}" if label_text else f"{name} {_number(value)}")
    return lines


def render(snap: usage.Snapshot) -> str:
    lines: list[str] = []
    lines += family("tuneforge_queue_depth", "gauge", "Jobs queued to run, by the tier of their tenant.",
                    [({"tier": tier}, count) for tier, count in snap.queue_depth.items()])
    lines += family("tuneforge_queue_wait_seconds", "gauge",
                    "Time in the queue of the longest-waiting queued job, by tier (0 when none is queued).",
                    [({"tier": tier}, round(wait_s, 3)) for tier, wait_s in snap.oldest_wait_s.items()])
    lines += family("tuneforge_running_jobs", "gauge", "Jobs running now.", [({}, snap.running_jobs)])
    # with the inventory unknown to this process (see Platform.capacity), its families have no sample
    lines += family("tuneforge_gpus_total", "gauge", "GPUs (or slots) the executor offers.",
                    [({}, snap.gpus_total)] if snap.gpus_total is not None else [])
    lines += family("tuneforge_gpus_busy", "gauge", "GPUs held by starting or running attempts.",
                    [({}, snap.gpus_busy)])
    utilization = snap.gpu_utilization
    lines += family("tuneforge_gpu_utilization", "gauge", "Busy GPUs over total GPUs (0 to 1).",
                    [({}, round(utilization, 6))] if utilization is not None else [])
    lines += family("tuneforge_preemptions_total", "counter", "Attempts that were preempted.",
                    [({}, snap.preemptions)])
    lines += family("tuneforge_jobs_total", "gauge", "Jobs by current status.",
                    [({"status": status}, count) for status, count in sorted(snap.jobs_by_status.items())])
    return "\n".join(lines) + "\n"


@router.get("/metrics", include_in_schema=False)
def metrics(session: Session = deps.SESSION, platform: Platform = Depends(deps.platform)) -> Response:
    snap = usage.platform_snapshot(session, platform, TIERS, time.time())
    return Response(render(snap), media_type=CONTENT_TYPE)
