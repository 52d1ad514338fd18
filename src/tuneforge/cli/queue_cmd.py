"""`tuneforge queue`: the whole queue in scheduling order, for admins (reads the database directly)."""

from __future__ import annotations

import time

import typer

from tuneforge.cli.admin import platform as open_platform
from tuneforge.cli.lazy import Lazy

queue_service = Lazy("tuneforge.services.training.queue")
tenant_service = Lazy("tuneforge.services.tenancy.tenants")


def show_queue() -> None:
    """Queued jobs in the order they will start: tenant, tier, GPUs, wait so far and estimated start."""
    platform = open_platform()
    now = time.time()
    with platform.db.session() as session:
        names = {t.tenant_id: t.name for t in tenant_service.list_tenants(session)}
        entries = queue_service.whole_queue(session, platform, now)
    never = "never (larger than the inventory)" if platform.capacity() is not None else \
        "unknown (the executor's inventory is not known here)"
    if not entries:
        typer.echo("the queue is empty")
        return
    typer.echo(f"{'pos':>4}  {'job':<28}{'tenant':<16}{'tier':<10}{'gpus':>5}{'waiting':>10}  estimated start")
    for entry in entries:
        waited = f"{(now - entry.queued_at) / 60:.0f} min"
        start = never if entry.estimated_start is None else \
            ("now" if entry.estimated_start <= now + 1 else
             time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(entry.estimated_start)))
        typer.echo(f"{entry.position:>4}  {entry.job_id:<28}{names.get(entry.tenant_id, entry.tenant_id):<16}"
                   f"{entry.tier:<10}{entry.gpus:>5}{waited:>10}  {start}")
