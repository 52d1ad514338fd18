"""Which queued jobs start, where, and which running jobs make room: pure functions.

Nothing here touches the database, the clock or an executor: the scheduler
loop builds the inputs from its rows and the executor's inventory, and
`benchmarks/scheduler_sim.py` drives the very same functions in simulated
time. Every rule is one function:

- `order_queue` — tier first (premium, standard, free) with aging: waiting
  `aging_s` seconds is worth one tier, so nothing starves; within a tier,
  fair share pushes back tenants by their recent GPU usage; FIFO otherwise.
  The sort key does not change as time passes (aging moves every job at the
  same rate), so it is computed once per job and tick.
- `place` — gang placement: a job gets all its GPUs on one node, or, for a
  job larger than a node, whole nodes, all at once — or nothing.
- `plan` — EASY backfilling: jobs start in order while they fit; the first
  one that does not gets a reservation at the earliest time enough GPUs are
  free (from running jobs' estimated ends); a later job may start ahead only
  if it ends before that time or uses no GPU the reservation needs.
- `choose_victims` — checkpoint-aware preemption for a job waiting past its
  tier's target: lower-tier running jobs, those that lose least first (least
  time since their last checkpoint, then lowest tier, then least progress),
  only as many as make the job fit.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Sequence

TIER_RANK = {"premium": 0, "standard": 1, "free": 2}


@dataclass(frozen=True)
class PolicyConfig:
    aging_s: float = 43200.0  # waiting this long is worth one tier (12 h: see docs/benchmarks-scheduler.md)
    fair_share_s_per_gpu_hour: float = 60.0  # each recent GPU-hour of a tenant delays its jobs this much
    fair_share_max_s: float = 1800.0
    target_wait_s: dict[str, float | None] = field(
        default_factory=lambda: {"premium": 300.0, "standard": None, "free": None})
    backfill_depth: int = 500  # queued jobs examined for backfill per tick


@dataclass(frozen=True)
class QueuedJob:
    job_id: str
    tenant_id: str
    tier: str
    gpus: int
    queued_at: float
    runtime_s: float  # estimated
    gpus_per_node: int = 0  # 0: all on one node; else a multi-node job takes gpus / gpus_per_node nodes


@dataclass(frozen=True)
class RunningJob:
    job_id: str
    tenant_id: str
    tier: str
    placement: dict[str, tuple[int, ...]]  # node -> GPU ids
    started_at: float
    expected_end: float
    last_checkpoint_at: float
    progress: float = 0.0  # 0..1
    queued_at: float = 0.0  # where it would rank if requeued (a requeued job keeps its queue time)

    @property
    def gpus(self) -> int:
        return sum(len(ids) for ids in self.placement.values())


@dataclass
class Node:
    name: str
    total: int
    free: set[int]


Assignment = dict[str, tuple[int, ...]]  # node -> GPU ids


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


def iter_queue(jobs: Iterable[QueuedJob], config: PolicyConfig,
               recent_gpu_hours: dict[str, float]) -> Iterator[QueuedJob]:
    """The same order, produced lazily: a tick reads the head and a bounded
    number of jobs behind it, so it pays a heap build (linear) instead of a
    full sort."""
    keyed = _keyed(jobs, config, recent_gpu_hours)
    heapq.heapify(keyed)
    while keyed:
        yield heapq.heappop(keyed)[2]


def place(job: QueuedJob, nodes: Sequence[Node]) -> Assignment | None:
    """All of the job's GPUs or None. One node: the fullest node that fits
    (keeps whole nodes free for big jobs); several: the emptiest nodes."""
    if job.gpus <= 0:
        return {}
    if not job.gpus_per_node:
        best: Node | None = None
        best_free = 0
        for node in nodes:  # one pass: this runs for every candidate of every tick
            free = len(node.free)
            if free >= job.gpus and (best is None or free < best_free or (free == best_free and node.name < best.name)):
                best, best_free = node, free
        if best is None:
            return None
        return {best.name: tuple(sorted(best.free)[: job.gpus])}
    count = math.ceil(job.gpus / job.gpus_per_node)
    fits = sorted((node for node in nodes if len(node.free) >= job.gpus_per_node),
                  key=lambda node: (-len(node.free), node.name))
    if len(fits) < count:
        return None
    return {node.name: tuple(sorted(node.free)[: job.gpus_per_node]) for node in fits[:count]}


def _take(nodes: Sequence[Node], assignment: Assignment) -> None:
    by_name = {node.name: node for node in nodes}
    for name, ids in assignment.items():
        by_name[name].free.difference_update(ids)


def _give(nodes: Sequence[Node], assignment: Assignment) -> None:
    by_name = {node.name: node for node in nodes}
    for name, ids in assignment.items():
        if name in by_name:
            by_name[name].free.update(ids)


def _copy(nodes: Sequence[Node]) -> list[Node]:
    return [Node(node.name, node.total, set(node.free)) for node in nodes]


@dataclass(frozen=True)
class Reservation:
    job_id: str
    start: float  # estimated
    assignment: Assignment


def reserve(job: QueuedJob, nodes: Sequence[Node], running: Sequence[RunningJob],
            now: float) -> Reservation | None:
    """When and where `job` could start as running jobs end (in order of expected end)."""
    future = _copy(nodes)
    placed = place(job, future)
    if placed is not None:
        return Reservation(job.job_id, now, placed)
    for finished in sorted(running, key=lambda r: r.expected_end):
        _give(future, finished.placement)
        placed = place(job, future)
        if placed is not None:
            return Reservation(job.job_id, max(now, finished.expected_end), placed)
    return None  # larger than the whole inventory


@dataclass
class Plan:
    starts: list[tuple[QueuedJob, Assignment]]
    reservation: Reservation | None
    blocked: QueuedJob | None  # the head of the queue that had to wait
    free: list[Node]  # what is left free after the starts


def plan(ordered: Sequence[QueuedJob], nodes: Sequence[Node], running: Sequence[RunningJob],
         now: float, config: PolicyConfig = PolicyConfig(),
         can_start: callable = lambda job: True) -> Plan:  # type: ignore[valid-type]
    """Start in order while jobs fit; then EASY backfill behind the first that does not."""
    free = _copy(nodes)
    starts: list[tuple[QueuedJob, Assignment]] = []
    reservation: Reservation | None = None
    blocked: QueuedJob | None = None
    examined = 0
    for job in ordered:
        if not can_start(job):  # e.g. the tenant is at its concurrency cap
            continue
        if blocked is not None:
            examined += 1
            if examined > config.backfill_depth:
                break
        assignment = place(job, free)
        if blocked is None:
            if assignment is not None:
                _take(free, assignment)
                starts.append((job, assignment))
                continue
            blocked = job
            reservation = reserve(job, free, running, now)
            continue
        if assignment is None:
            continue
        if reservation is None or now + job.runtime_s <= reservation.start or \
                not _overlaps(assignment, reservation.assignment):
            _take(free, assignment)
            starts.append((job, assignment))
    return Plan(starts, reservation, blocked, free)


def _overlaps(a: Assignment, b: Assignment) -> bool:
    return any(set(ids) & set(b.get(node, ())) for node, ids in a.items())


def waited_too_long(job: QueuedJob, now: float, config: PolicyConfig) -> bool:
    target = config.target_wait_s.get(job.tier)
    return target is not None and now - job.queued_at > target


def choose_victims(job: QueuedJob, nodes: Sequence[Node], running: Sequence[RunningJob],
                   now: float, quantum_s: float = 60.0,
                   config: PolicyConfig | None = None) -> list[RunningJob] | None:
    """The running jobs to preempt (checkpoint, then requeue) so that `job` fits
    now, losing the least work; None when preempting every lower-tier job would
    not be enough; [] when it fits already.

    Loss of a victim: time since its last checkpoint (in `quantum_s` steps, so
    seconds apart do not outweigh the tier), then lowest tier, then least
    progress. A single-node job is seated on the node where the victims it
    needs cost least — fewest GPUs taken from others (a 4-node job is never
    sent back to seat a 2-GPU job when a node of small jobs would do), then
    least loss; a multi-node job frees victims in loss order until it fits.

    With `config`, a job that would rank ahead of `job` once requeued (an
    aged lower-tier job) is never a victim: it would take its GPUs back at the
    next tick and the preemption would achieve nothing."""
    if place(job, nodes) is not None:
        return []
    rank = TIER_RANK.get(job.tier, 2)
    candidates = [r for r in running if TIER_RANK.get(r.tier, 2) > rank]
    if config is not None:
        mine = rank * config.aging_s + job.queued_at
        candidates = [r for r in candidates if TIER_RANK.get(r.tier, 2) * config.aging_s + r.queued_at > mine]

    def loss(victim: RunningJob) -> tuple[float, int, float]:
        return ((now - victim.last_checkpoint_at) // quantum_s, -TIER_RANK.get(victim.tier, 2), victim.progress)

    candidates.sort(key=loss)
    if not job.gpus_per_node:
        best: tuple[tuple, list[RunningJob]] | None = None
        for node in nodes:
            if node.total < job.gpus:
                continue
            free, chosen = len(node.free), []
            for victim in candidates:
                if free >= job.gpus:
                    break
                held = len(victim.placement.get(node.name, ()))
                if held:
                    chosen.append(victim)
                    free += held
            if free < job.gpus:
                continue
            cost = (sum(v.gpus for v in chosen), [loss(v) for v in chosen])
            if best is None or cost < best[0]:
                best = (cost, chosen)
        return None if best is None else best[1]
    future = _copy(nodes)
    chosen = []
    for victim in candidates:
        if place(job, future) is not None:
            break
        _give(future, victim.placement)
        chosen.append(victim)
    landing = place(job, future)
    if landing is None:
        return None
    # drop victims that turned out unnecessary (an earlier pick freed a node the job does not land on)
    return [v for v in chosen if _overlaps(v.placement, landing)]
