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
- `choose_victims` — checkpoint-aware preemption for a job that would wait
  past its tier's target: lower-tier running jobs, those that lose least
  first (least time since their last checkpoint, then lowest tier, then least
  progress), only as many as make the job fit.
- `decide` — one scheduling decision, as the loop takes it every tick: the
  jobs holding GPUs that a preemption freed for them start first, then `plan`;
  then, for the first jobs in queue order whose tier has a target wait and
  whose estimated start (`reserve`) is past it, or who are past it already,
  victims and a hold: the GPUs they will land on, which nobody else gets until
  they start (or the hold lapses).

The queue's order (`order_queue`, `QueueIndex`, `iter_queue`) lives in
`planning/ordering.py` and the policy's inputs in `planning/policy_inputs.py`;
both are re-exported here.
"""


from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from tuneforge.planning.ordering import QueueIndex, iter_queue, jobs_with_a_target, order_queue, queue_key
from tuneforge.planning.policy_inputs import TIER_RANK, Assignment, Node, PolicyConfig, QueuedJob, RunningJob

__all__ = [
    "TIER_RANK", "Assignment", "Decision", "Hold", "Node", "Plan", "PolicyConfig", "QueueIndex", "QueuedJob",
    "Reservation", "RunningJob", "choose_victims", "decide", "expected_end", "iter_queue", "order_queue", "place",
    "plan", "queue_key", "reserve", "waited_too_long", "would_wait_too_long",
]


def place(job: QueuedJob, nodes: Sequence[Node]) -> Assignment | None:
    """All of the job's GPUs or None. One node: the fullest node that fits
    (keeps whole nodes free for big jobs); several: the emptiest nodes. A job limited to
    capacity pools takes the first of them (its cheapest) where it fits, on that pool's nodes.
    Only nodes whose GPUs are of the job's type and have the memory it needs count
    (`Node.fits`)."""
    if job.gpus <= 0:
        return {}
    if not job.hardware.any:
        nodes = [node for node in nodes if node.fits(job.hardware)]
    if job.pools is not None:
        for pool in job.pools:
            placed = _place_on(job, [node for node in nodes if node.pool == pool])
            if placed is not None:
                return placed
        return None
    return _place_on(job, nodes)


def _place_on(job: QueuedJob, nodes: Sequence[Node]) -> Assignment | None:
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
    return [Node(node.name, node.total, set(node.free), node.pool, node.gpu_model, node.gpu_memory_gb)
            for node in nodes]


@dataclass(frozen=True)
class Reservation:
    job_id: str
    start: float  # estimated
    assignment: Assignment


def expected_end(job: RunningJob, now: float, config: PolicyConfig) -> float:
    """When a running job should end. One already past its estimated end has not
    ended, so it is not expected "now": another share of its estimate, at least
    `min_overrun_s`, counted from now."""
    if job.expected_end > now:
        return job.expected_end
    return now + max(config.min_overrun_s, config.overrun_fraction * (job.expected_end - job.started_at))


def reserve(job: QueuedJob, nodes: Sequence[Node], running: Sequence[RunningJob],
            now: float, config: PolicyConfig = PolicyConfig()) -> Reservation | None:
    """When and where `job` could start as running jobs end (in order of expected end)."""
    future = _copy(nodes)
    placed = place(job, future)
    if placed is not None:
        return Reservation(job.job_id, now, placed)
    for end, finished in sorted(((expected_end(r, now, config), r) for r in running), key=lambda e: e[0]):
        _give(future, finished.placement)
        placed = place(job, future)
        if placed is not None:
            return Reservation(job.job_id, end, placed)
    return None  # larger than the whole inventory


@dataclass
class Plan:
    starts: list[tuple[QueuedJob, Assignment]]
    reservation: Reservation | None
    blocked: QueuedJob | None  # the head of the queue that had to wait
    free: list[Node]  # what is left free after the starts
    admitted: set[str] = field(default_factory=set)  # can_start said yes (whether or not the job fit)
    refused: set[str] = field(default_factory=set)  # can_start said no (e.g. the tenant's concurrency cap)


def _largest_free(nodes: Sequence[Node]) -> int:
    return max((len(node.free) for node in nodes), default=0)


def plan(ordered: Iterable[QueuedJob], nodes: Sequence[Node], running: Sequence[RunningJob],
         now: float, config: PolicyConfig = PolicyConfig(),
         can_start: Callable[[QueuedJob], bool] = lambda job: True) -> Plan:
    """Start in order while jobs fit; then EASY backfill behind the first that does not."""
    free = _copy(nodes)
    result = Plan([], None, None, free)
    examined = 0
    largest = _largest_free(free)  # a job needing more GPUs on one node than any node has free cannot fit
    for job in ordered:
        if result.blocked is not None:
            examined += 1
            if examined > config.backfill_depth:
                break
        if not can_start(job):
            result.refused.add(job.job_id)
            continue
        result.admitted.add(job.job_id)
        per_node = job.gpus_per_node or job.gpus
        assignment = place(job, free) if per_node <= largest else None
        if result.blocked is None:
            if assignment is not None:
                _take(free, assignment)
                largest = _largest_free(free)
                result.starts.append((job, assignment))
                continue
            result.blocked = job
            result.reservation = reserve(job, free, running, now, config)
            continue
        if assignment is None:
            continue
        reservation = result.reservation
        if reservation is None or now + job.runtime_s <= reservation.start or \
                not _overlaps(assignment, reservation.assignment):
            _take(free, assignment)
            largest = _largest_free(free)
            result.starts.append((job, assignment))
    return result


def _overlaps(a: Assignment, b: Assignment) -> bool:
    return any(set(ids) & set(b.get(node, ())) for node, ids in a.items())


def waited_too_long(job: QueuedJob, now: float, config: PolicyConfig) -> bool:
    target = config.target_wait_s.get(job.tier)
    return target is not None and now - job.queued_at > target


def choose_victims(job: QueuedJob, nodes: Sequence[Node], running: Sequence[RunningJob],
                   now: float, quantum_s: float = 60.0) -> list[RunningJob] | None:
    """The running jobs to preempt (checkpoint, then requeue) so that `job` fits
    now, losing the least work; None when preempting every lower-tier job would
    not be enough; [] when it fits already.

    Loss of a victim: time since its last checkpoint (in `quantum_s` steps, so
    seconds apart do not outweigh the tier), then lowest tier, then least
    progress. A single-node job is seated on the node where the victims it
    needs cost least — fewest GPUs taken from others (a 4-node job is never
    sent back to seat a 2-GPU job when a node of small jobs would do), then
    least loss; a multi-node job frees victims in loss order until it fits.

    A lower-tier job that has aged past `job` is a victim like any other: the
    GPUs it frees are held for `job` (`decide`), so it cannot take them back;
    requeued with its original queue time, it is first in line for the next."""
    if place(job, nodes) is not None:
        return []
    rank = TIER_RANK.get(job.tier, 2)
    candidates = [r for r in running if TIER_RANK.get(r.tier, 2) > rank]

    def loss(victim: RunningJob) -> tuple[float, int, float]:
        return ((now - victim.last_checkpoint_at) // quantum_s, -TIER_RANK.get(victim.tier, 2), victim.progress)

    candidates.sort(key=loss)
    if not job.gpus_per_node:
        on_node: dict[str, list[tuple[RunningJob, int]]] = {}  # node -> (victim, GPUs it holds there), loss order
        for victim in candidates:
            for name, ids in victim.placement.items():
                on_node.setdefault(name, []).append((victim, len(ids)))
        best: tuple[tuple, list[RunningJob]] | None = None
        for node in nodes:
            if node.total < job.gpus or not node.fits(job.hardware):
                continue
            free, chosen = len(node.free), []
            for victim, held in on_node.get(node.name, ()):
                if free >= job.gpus:
                    break
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


def would_wait_too_long(job: QueuedJob, nodes: Sequence[Node], running: Sequence[RunningJob],
                        now: float, config: PolicyConfig) -> bool:
    """Past its tier's target already, or not expected to start before it (its
    estimated start, from running jobs' expected ends, is later)."""
    target = config.target_wait_s.get(job.tier)
    if target is None:
        return False
    if now - job.queued_at > target:
        return True
    reservation = reserve(job, nodes, running, now, config)
    return reservation is None or reservation.start - job.queued_at > target


@dataclass(frozen=True)
class Hold:
    """GPUs a preemption freed (or is freeing) for `job_id`: nobody else gets them
    until the job starts on them or `until` passes."""

    job_id: str
    assignment: Assignment
    until: float


@dataclass
class Decision:
    starts: list[tuple[QueuedJob, Assignment]]
    preemptions: list[tuple[QueuedJob, list[RunningJob], Assignment]]  # for whom, victims, where it lands
    blocked: QueuedJob | None
    reservation: Reservation | None
    free: list[Node]

    @property
    def victims(self) -> list[RunningJob]:
        return [victim for _job, victims, _landing in self.preemptions for victim in victims]

    def holds(self, now: float, config: PolicyConfig) -> list[Hold]:
        return [Hold(job.job_id, landing, now + config.hold_s) for job, _victims, landing in self.preemptions]


def _held_ids(assignment: Assignment, node: Node) -> set[int]:
    return set(assignment.get(node.name, ())) & node.free


def decide(queue: Iterable[QueuedJob] | QueueIndex, nodes: Sequence[Node], running: Sequence[RunningJob],
           now: float, config: PolicyConfig = PolicyConfig(), recent_gpu_hours: Mapping[str, float] | None = None,
           *, stopping: Iterable[str] = (), holds: Mapping[str, Hold] | None = None,
           can_start: Callable[[QueuedJob], bool] = lambda job: True) -> Decision:
    """One scheduling decision (see the module docstring). `stopping`: running jobs
    already asked to checkpoint and stop (their GPUs are as good as free for
    preemption). `holds`: current holds by job id; the caller keeps them (from
    `Decision.holds`) until the job starts or the hold lapses."""
    usage = recent_gpu_hours or {}
    queue = queue if isinstance(queue, QueueIndex) else list(queue)
    lookup = queue.get if isinstance(queue, QueueIndex) else {job.job_id: job for job in queue}.get
    stopping = set(stopping)
    free = _copy(nodes)
    by_name = {node.name: node for node in free}

    # 1. holds: the held GPUs are the holder's; a holder whose GPUs are all free starts on them
    starts: list[tuple[QueuedJob, Assignment]] = []
    holding: dict[str, Hold] = {}
    for hold in sorted((holds or {}).values(), key=lambda h: h.until):
        job = lookup(hold.job_id)
        if job is None or hold.until <= now:
            continue
        holding[job.job_id] = hold
        complete = all(set(ids) <= by_name[name].free for name, ids in hold.assignment.items() if name in by_name) \
            and all(name in by_name for name in hold.assignment)
        for name in hold.assignment:
            if name in by_name:
                by_name[name].free -= _held_ids(hold.assignment, by_name[name])
        if complete and can_start(job):
            starts.append((job, hold.assignment))

    # 2. everyone else: in order, with backfill
    ordered = (job for job in iter_queue(queue, config, usage) if job.job_id not in holding)
    result = plan(ordered, free, running, now, config, can_start)
    starts.extend(result.starts)

    # 3. preemption for jobs that would wait past their tier's target
    started = {job.job_id for job, _ in starts}
    view = _copy(result.free)
    view_by_name = {node.name: node for node in view}
    held_elsewhere = {(name, gpu) for hold in holding.values() for name, ids in hold.assignment.items() for gpu in ids}
    for ending in running:
        if ending.job_id in stopping:  # their GPUs come free soon: count them, unless already promised
            for name, ids in ending.placement.items():
                if name in view_by_name:
                    view_by_name[name].free.update(gpu for gpu in ids if (name, gpu) not in held_elsewhere)
    candidates = [other for other in running if other.job_id not in stopping]
    preemptions: list[tuple[QueuedJob, list[RunningJob], Assignment]] = []
    skip = started | set(holding) | result.refused
    for job in jobs_with_a_target(queue, config, usage, skip, config.preemptors_per_tick):
        if job.job_id not in result.admitted and not can_start(job):
            continue
        if not would_wait_too_long(job, view, candidates, now, config):
            continue
        victims = choose_victims(job, view, candidates, now)
        if victims is None:
            continue
        future = _copy(view)
        for victim in victims:
            _give(future, victim.placement)
        landing = place(job, future)
        if landing is None:  # cannot happen: choose_victims freed enough
            continue
        preemptions.append((job, victims, landing))
        chosen = {victim.job_id for victim in victims}
        candidates = [c for c in candidates if c.job_id not in chosen]
        for victim in victims:  # what the victims free beyond the landing stays usable for the next job
            _give(view, victim.placement)
        _take(view, landing)
    return Decision(starts, preemptions, result.blocked, result.reservation, result.free)

