"""The cluster as the policy sees it, read from the database and the executor's inventory.

The database is the truth about which GPUs tuneforge's attempts hold (an
attempt's placement is written before it is launched), so a restarted control
plane sees the same picture; the executor says which nodes exist, how many GPUs
each has and how many it sees free. On a shared cluster (Ray) GPUs can be busy
with work outside tuneforge: what the executor sees taken beyond the database's
attempts is taken away from the node's free GPUs as well.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from tuneforge.db.repos import attempts as attempt_repo
from tuneforge.db.repos import scheduling as scheduling_repo
from tuneforge.db.repos import tenants as tenant_repo
from tuneforge.db.tables import Attempt, Job
from tuneforge.domain.resolved import ResolvedResources
from tuneforge.domain.status import JobStatus
from tuneforge.executors.protocol import Capacity
from tuneforge.planning.hardware import hardware_ask
from tuneforge.planning.policy import Node, QueuedJob, RunningJob
from tuneforge.planning.pools import SPOT, PoolSetup, allowed_pools, at_risk

FAIR_SHARE_WINDOW_S = 24 * 3600.0


@dataclass
class ClusterState:
    nodes: list[Node]
    running: list[RunningJob]
    queued: list[QueuedJob]
    recent_gpu_hours: dict[str, float]  # tenant -> GPU-hours in the fair-share window
    stopping: set[str]  # jobs whose attempt was asked to checkpoint and stop
    handles: dict[str, tuple[int, dict[str, Any]]]  # running job -> (attempt number, handle)
    moving: list[str] = field(default_factory=list)  # auto jobs on spot whose deadline is at risk there


def placement_spans(placement: dict[str, Any] | None) -> dict[str, tuple[int, ...]]:
    """node -> GPU ids of a stored placement (older rows hold one node only)."""
    if not placement:
        return {}
    spans = placement.get("spans")
    if spans:
        return {name: tuple(ids) for name, ids in spans.items()}
    return {placement.get("node", "local"): tuple(placement.get("gpu_ids", []))}


def _runtime_s(job: Job) -> float:
    """The job's estimated runtime; an hour when it has no estimate."""
    estimate = job.resolved.estimate if job.resolved is not None else None
    return (estimate.estimated_runtime_seconds if estimate is not None else 0.0) or 3600.0


def read_state(session: Session, capacity: Capacity, now: float, pools: PoolSetup | None = None) -> ClusterState:
    nodes = {n.name: Node(n.name, n.total_gpus, set(range(n.total_gpus)),
                          pools.node_pool(n.name, n.pool) if pools else "", n.gpu_model, n.gpu_memory_gb)
             for n in capacity.nodes}
    active = attempt_repo.active(session)
    jobs = {j.job_id: j for j in scheduling_repo.running_or_queued(session, [a.job_id for a in active])}
    tiers = tenant_repo.tiers(session)
    checkpointed = scheduling_repo.newest_checkpoint_at(session)

    running: list[RunningJob] = []
    stopping: set[str] = set()
    moving: list[str] = []
    handles: dict[str, tuple[int, dict[str, Any]]] = {}
    held: dict[str, int] = defaultdict(int)  # node -> GPUs our attempts hold there
    for attempt in active:
        spans = placement_spans(attempt.placement)
        for name, ids in spans.items():
            if name in nodes:
                nodes[name].free.difference_update(ids)
                held[name] += len(ids)
        job = jobs.get(attempt.job_id)
        if job is None:
            continue
        runtime = _runtime_s(job)
        running.append(RunningJob(
            job_id=job.job_id, tenant_id=job.tenant_id, tier=tiers.get(job.tenant_id, "standard"),
            placement=spans, started_at=attempt.started_at, expected_end=attempt.started_at + runtime,
            last_checkpoint_at=float(checkpointed.get(job.job_id) or attempt.started_at),
            progress=min(1.0, (now - attempt.started_at) / runtime) if runtime > 0 else 0.0,
            queued_at=float(job.created_at)))
        handles[job.job_id] = (attempt.number, attempt.handle or {})
        if (attempt.handle or {}).get("preempt_sent"):
            stopping.add(job.job_id)
        elif pools is not None and _deadline_at_risk(pools, job, attempt, tiers, running[-1], now):
            moving.append(job.job_id)

    _take_foreign_use(nodes, capacity, held)
    for reported in capacity.nodes:  # a node being drained takes nothing new
        if reported.draining and reported.name in nodes:
            nodes[reported.name].free.clear()

    queued = []
    waiting = [job for job in jobs.values()
               if job.status == JobStatus.QUEUED.value and not (job.not_before and job.not_before > now)]
    waiting_ids = [job.job_id for job in waiting]
    preempted = spot_preemptions(session, pools, waiting_ids) if pools else {}
    done = work_done(session, waiting_ids) if pools else {}
    requeued = scheduling_repo.last_attempt_end(session, waiting_ids) if pools and waiting_ids else {}
    for job in waiting:
        resources = job.resolved.resources if job.resolved is not None else ResolvedResources()
        tier = tiers.get(job.tenant_id, "standard")
        allowed = None
        if pools is not None:
            ask = pools.ask(tier, resources.capacity, resources.deadline, resources.max_price,
                            preempted.get(job.job_id, 0), float(job.created_at), _nodes(resources),
                            requeued.get(job.job_id))
            remaining = _runtime_s(job) * (1 - done.get(job.job_id, 0.0))
            allowed = allowed_pools(ask, remaining, list(pools.pools.values()), now, pools.rules)
        queued.append(QueuedJob(
            job_id=job.job_id, tenant_id=job.tenant_id, tier=tier,
            gpus=resources.gpus, queued_at=float(job.created_at), runtime_s=_runtime_s(job),
            gpus_per_node=resources.gpus_per_node, seq=job.pk, pools=allowed, hardware=hardware_ask(resources)))
    queued.sort(key=lambda job: (job.queued_at, job.seq, job.job_id))  # arrival order: QueueIndex appends
    return ClusterState(list(nodes.values()), running, queued, recent_usage(session, now), stopping, handles,
                        moving)


def spot_preemptions(session: Session, pools: PoolSetup, job_ids: list[str]) -> dict[str, int]:
    """How many times spot capacity took each job's attempts away: a reclaim (the notice, a
    drained node, a SIGTERM from outside) or a spot node lost outright. The scheduler's own
    preemptions for other jobs, pauses and moves off spot do not count."""
    if not job_ids:
        return {}
    counts: dict[str, int] = defaultdict(int)
    for job_id, placement, handle, _failure_class, status in scheduling_repo.preempted_or_lost(session, job_ids):
        pool = pools.pools.get((placement or {}).get("pool", ""))
        if pool is None or pool.kind != SPOT:
            continue
        handle = handle or {}
        if status == "lost" or handle.get("reclaim_requested") or not handle.get("preempt_sent"):
            counts[job_id] += 1
    return dict(counts)


def work_done(session: Session, job_ids: list[str]) -> dict[str, float]:
    """The share of each job's training its newest checkpoint holds (0 to 1): what a requeued job
    does not have to do again."""
    if not job_ids:
        return {}
    steps = scheduling_repo.newest_checkpoint_step(session, job_ids)
    totals = scheduling_repo.total_steps(session, job_ids)
    return {job_id: min(1.0, steps[job_id] / totals[job_id]) for job_id in steps if totals.get(job_id)}


def _deadline_at_risk(pools: PoolSetup, job: Job, attempt: Attempt, tiers: dict[str, str], running: RunningJob,
                      now: float) -> bool:
    pool = pools.pools.get((attempt.placement or {}).get("pool", ""))
    if pool is None or pool.kind != SPOT or job.resolved is None:
        return False
    resources = job.resolved.resources
    ask = pools.ask(tiers.get(job.tenant_id, "standard"), resources.capacity, resources.deadline,
                    resources.max_price, 0, float(job.created_at), _nodes(resources))
    if attempt.total_steps:  # the work left by the steps done, not by the clock: reclaims cost time, not steps
        remaining = _runtime_s(job) * max(0.0, 1 - attempt.step / attempt.total_steps)
    else:
        remaining = max(0.0, running.expected_end - now)
    return at_risk(ask, remaining, pool, now, pools.rules)


def _nodes(resources: ResolvedResources) -> int:
    return max(1, resources.gpus // resources.gpus_per_node) if resources.gpus_per_node else 1


def _take_foreign_use(nodes: dict[str, Node], capacity: Capacity, held: dict[str, int]) -> None:
    """GPUs the executor sees taken on a node beyond what our attempts hold there are busy
    with other work: remove that many (the highest ids) from the node's free set."""
    for reported in capacity.nodes:
        node = nodes.get(reported.name)
        if node is None:
            continue
        foreign = (reported.total_gpus - reported.free_gpus) - held.get(reported.name, 0)
        for gpu_id in sorted(node.free, reverse=True)[:max(0, foreign)]:
            node.free.discard(gpu_id)


def recent_usage(session: Session, now: float, window_s: float = FAIR_SHARE_WINDOW_S) -> dict[str, float]:
    """GPU-hours each tenant used in the last `window_s` seconds (running attempts up to now)."""
    since = now - window_s
    rows = scheduling_repo.attempt_spans_since(session, since)
    usage: dict[str, float] = defaultdict(float)
    for tenant_id, gpus, started, ended in rows:
        seconds = max(0.0, min(ended or now, now) - max(started or now, since))
        usage[tenant_id] += (gpus or 0) * seconds / 3600
    return dict(usage)
