"""The queue's order: tier first (premium, standard, free) with aging — waiting
`aging_s` seconds is worth one tier, so nothing starves — then, within a tier,
fair share by recent GPU usage, FIFO otherwise.

The sort key does not change as time passes (aging moves every job at the
same rate), so it is computed once per job and tick. `QueueIndex` keeps the
queue grouped by (tier, tenant) in arrival order, the part of the order that
does not change between ticks; `iter_queue` merges the groups lazily, so a
tick costs the jobs it looks at, not the queue's length.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterable, Iterator, Mapping

from tuneforge.planning.policy_inputs import TIER_RANK, PolicyConfig, QueuedJob


def queue_key(job: QueuedJob, config: PolicyConfig, recent_gpu_hours: dict[str, float]) -> float:
    """Smaller starts first; comparable across ticks (time-invariant aging)."""
    penalty = min(config.fair_share_max_s,
                  recent_gpu_hours.get(job.tenant_id, 0.0) * config.fair_share_s_per_gpu_hour)
    return TIER_RANK.get(job.tier, 2) * config.aging_s + job.queued_at + penalty


def _keyed(jobs: Iterable[QueuedJob], config: PolicyConfig,
           recent_gpu_hours: dict[str, float]) -> list[tuple[float, int, QueuedJob]]:
    """(queue_key, arrival index, job) for every job, with the per-tier and per-tenant parts looked up once."""
    tier_part = {tier: rank * config.aging_s for tier, rank in TIER_RANK.items()}
    lowest = 2 * config.aging_s
    penalty = {tenant: min(config.fair_share_max_s, hours * config.fair_share_s_per_gpu_hour)
               for tenant, hours in recent_gpu_hours.items()}
    return [(tier_part.get(job.tier, lowest) + job.queued_at + penalty.get(job.tenant_id, 0.0), index, job)
            for index, job in enumerate(jobs)]


def order_queue(jobs: Iterable[QueuedJob], config: PolicyConfig,
                recent_gpu_hours: dict[str, float]) -> list[QueuedJob]:
    """The whole queue in the order jobs start (see `queue_key`)."""
    keyed = _keyed(jobs, config, recent_gpu_hours)
    keyed.sort()
    return [job for _key, _index, job in keyed]


class QueueIndex:
    """Queued jobs grouped by (tier, tenant), each group in arrival order.

    Within a group the queue key differs only by arrival time, so a group's
    order never changes; only the offsets between groups do (fair share moves
    with usage). Jobs are added and removed as they enter and leave the queue."""

    def __init__(self, jobs: Iterable[QueuedJob] = ()) -> None:
        self._groups: dict[tuple[str, str], list[tuple[float, int, str, QueuedJob]]] = {}
        self._jobs: dict[str, QueuedJob] = {}
        for job in jobs:
            self.add(job)

    def add(self, job: QueuedJob) -> None:
        if job.job_id in self._jobs:
            self.remove(job.job_id)
        self._jobs[job.job_id] = job
        group = self._groups.setdefault((job.tier, job.tenant_id), [])
        entry = (job.queued_at, job.seq, job.job_id, job)
        if not group or group[-1][:3] < entry[:3]:
            group.append(entry)  # the usual case: arrivals come in time order
        else:
            bisect.insort(group, entry, key=lambda e: e[:3])

    def remove(self, job_id: str) -> QueuedJob | None:
        job = self._jobs.pop(job_id, None)
        if job is not None:
            group = self._groups[(job.tier, job.tenant_id)]
            at = bisect.bisect_left(group, (job.queued_at, job.seq, job.job_id), key=lambda e: e[:3])
            del group[at]
            if not group:
                del self._groups[(job.tier, job.tenant_id)]
        return job

    def get(self, job_id: str) -> QueuedJob | None:
        return self._jobs.get(job_id)

    def groups(self) -> Iterator[tuple[str, str, list[tuple[float, int, str, QueuedJob]]]]:
        for (tier, tenant), group in self._groups.items():
            yield tier, tenant, group

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._jobs

    def __iter__(self) -> Iterator[QueuedJob]:
        return iter(self._jobs.values())

    def __len__(self) -> int:
        return len(self._jobs)


def _group_offset(tier: str, tenant: str, config: PolicyConfig, recent_gpu_hours: Mapping[str, float]) -> float:
    penalty = min(config.fair_share_max_s, recent_gpu_hours.get(tenant, 0.0) * config.fair_share_s_per_gpu_hour)
    return TIER_RANK.get(tier, 2) * config.aging_s + penalty


def iter_queue(jobs: Iterable[QueuedJob] | QueueIndex, config: PolicyConfig,
               recent_gpu_hours: Mapping[str, float]) -> Iterator[QueuedJob]:
    """The same order as `order_queue`, produced lazily: a tick reads the head and
    a bounded number of jobs behind it. From a `QueueIndex` the groups are merged
    (a heap of one entry per group); from a plain list, a heap of every job."""
    if not isinstance(jobs, QueueIndex):
        keyed = _keyed(jobs, config, dict(recent_gpu_hours))
        heapq.heapify(keyed)
        while keyed:
            yield heapq.heappop(keyed)[2]
        return
    heap = []
    for tier, tenant, group in jobs.groups():
        offset = _group_offset(tier, tenant, config, recent_gpu_hours)
        heap.append((offset + group[0][0], group[0][1], group[0][2], offset, 0, group))
    heapq.heapify(heap)
    while heap:
        _key, _seq, _job_id, offset, at, group = heap[0]
        yield group[at][3]
        at += 1
        if at < len(group):
            entry = group[at]
            heapq.heapreplace(heap, (offset + entry[0], entry[1], entry[2], offset, at, group))
        else:
            heapq.heappop(heap)


def jobs_with_a_target(queue: Iterable[QueuedJob] | QueueIndex, config: PolicyConfig,
                   recent_gpu_hours: Mapping[str, float], skip: set[str], limit: int) -> list[QueuedJob]:
    """The first `limit` jobs in queue order whose tier has a target wait, not in `skip`."""
    tiers = {tier for tier, target in config.target_wait_s.items() if target is not None}
    found: list[tuple[float, int, str, QueuedJob]] = []
    if isinstance(queue, QueueIndex):
        for tier, tenant, group in queue.groups():
            if tier not in tiers:
                continue
            offset = _group_offset(tier, tenant, config, recent_gpu_hours)
            taken = 0
            for queued_at, seq, job_id, job in group:
                if taken >= limit:
                    break
                if job_id not in skip:
                    found.append((offset + queued_at, seq, job_id, job))
                    taken += 1
    else:
        found = [(queue_key(job, config, dict(recent_gpu_hours)), job.seq, job.job_id, job)
                 for job in queue if job.tier in tiers and job.job_id not in skip]
    return [entry[3] for entry in heapq.nsmallest(limit, found, key=lambda e: e[:3])]
