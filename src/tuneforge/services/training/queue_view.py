"""The queue as tenants and admins see it: order, position, estimated start.

Estimated starts replay the queue in policy order on a timeline of expected
ends: each job starts at the first moment it fits after every job ahead of it
has started (no backfill assumed, so the estimate errs late rather than
early). Running jobs end at their estimated runtime (one already past it:
`policy.expected_end`). Without a known capacity (`None`: this process cannot
see the executor's inventory) the order and positions are given, no starts.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from sqlalchemy.orm import Session

from tuneforge.executors.protocol import Capacity
from tuneforge.planning.policy import Node, PolicyConfig, expected_end, order_queue, place
from tuneforge.planning.pools import PoolSetup
from tuneforge.services.training.cluster_state import read_state


@dataclass(frozen=True)
class QueueEntry:
    position: int
    job_id: str
    tenant_id: str
    tier: str
    gpus: int
    queued_at: float
    estimated_start: float | None  # None: larger than the whole inventory, or the inventory is unknown


def queue_view(session: Session, capacity: Capacity | None, policy: PolicyConfig, now: float,
               pools: PoolSetup | None = None) -> list[QueueEntry]:
    state = read_state(session, capacity or Capacity(nodes=[]), now, pools)
    ordered = order_queue(state.queued, policy, state.recent_gpu_hours)
    if capacity is None:
        return [QueueEntry(position, job.job_id, job.tenant_id, job.tier, job.gpus, job.queued_at, None)
                for position, job in enumerate(ordered, start=1)]
    nodes = [Node(n.name, n.total, set(n.free), n.pool, n.gpu_model, n.gpu_memory_gb) for n in state.nodes]
    by_name = {n.name: n for n in nodes}
    ends: list[tuple[float, int, dict[str, tuple[int, ...]]]] = []
    for index, job in enumerate(state.running):
        heapq.heappush(ends, (expected_end(job, now, policy), index, job.placement))
    clock, counter = now, len(ends)
    entries: list[QueueEntry] = []
    for position, job in enumerate(ordered, start=1):
        assignment = place(job, nodes)
        while assignment is None and ends:
            clock, _, released = heapq.heappop(ends)
            for name, ids in released.items():
                if name in by_name:
                    by_name[name].free.update(ids)
            assignment = place(job, nodes)
        start = clock if assignment is not None else None
        if assignment is not None:
            for name, ids in assignment.items():
                by_name[name].free.difference_update(ids)
            counter += 1
            heapq.heappush(ends, (clock + job.runtime_s, counter, assignment))
        entries.append(QueueEntry(position, job.job_id, job.tenant_id, job.tier, job.gpus, job.queued_at, start))
    return entries
