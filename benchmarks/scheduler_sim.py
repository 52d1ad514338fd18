"""Scheduling policy in simulated time: tuneforge against FIFO and strict priority.

    python benchmarks/scheduler_sim.py [--days 7] [--seed 0] [--queue-size 10000] [--ticks 50]

A discrete-event simulation of a GPU cluster (default 41 nodes of 8 GPUs,
328 GPUs). Events are job arrivals, job ends and preempted jobs' exits; the
scheduling policy runs after every event time, on a fixed tick (every
`--tick-s`, 60 simulated seconds) whenever jobs are queued, and when a job
with a target wait becomes overdue.

The trace (seeded, `--seed`): `--jobs-per-day` arrivals (500) as a Poisson
process whose rate is `--burst-factor` times higher (4x) during one hour of
every day (`--burst-hour`, 14:00-15:00); the daily total stays at 500, so
the base rate is 500 / (23 + 4) = 18.5 jobs/h and the burst hour 74 jobs/h.
Job classes: 70% small LoRA (1 GPU, mean 15 min), 20% medium LoRA (2 GPUs,
2 h), 9% 70B LoRA (4 GPUs, 4 h), 1% full fine-tune (32 GPUs as 4 whole
nodes, 24 h). True runtimes are lognormal around those means (sigma
`--runtime-sigma`, 0.5; the mean is kept); the policy only sees an estimate,
the true runtime times a lognormal factor of median 1 (sigma
`--estimate-sigma`, 0.3: about a third of the estimates are more than 1.35x
too long or too short).
20 tenants: 4 premium (25% of the jobs), 12 standard (60%), 4 free (15%);
inside a tier a tenant's share is proportional to 1/k (k = 1, 2, ...), so
each tier has heavy and light users. A job's class does not depend on its
tenant.

Policies, each on the same trace:

- fifo: queue order by arrival; jobs start in order while they fit
  (`policy.place`, gang placement); the first one that does not fit blocks
  everything behind it. No backfill, no preemption.
- strict: order by tier, then arrival; otherwise as fifo (no aging, no
  backfill, no preemption).
- tuneforge: what the scheduler loop does every tick
  (`Scheduler._admit_queued_jobs`): `policy.decide` on the queue (a
  `QueueIndex` kept up to date as jobs arrive, start and are requeued), the
  running jobs, those already stopping and the current holds. `decide`
  starts the jobs whose held GPUs are all free, then `plan` (tier order with
  aging, fair share from each tenant's GPU-hours in the last 24 simulated
  hours, FIFO; gang placement; EASY backfill behind the first blocked job),
  then, for the first jobs in queue order whose tier has a target wait
  (premium: 5 min) and whose estimated start is past it (or who waited past
  it already), `choose_victims` among the running jobs not already stopping
  and a hold on the GPUs the job will land on. A victim gets SIGTERM, writes
  a checkpoint (no training is lost) and exits `--stop-s` (30 s) later, its
  GPUs held meanwhile; it is then queued again, and a restart spends
  `--restore-s` (90 s) loading the model and the checkpoint: 2 minutes of
  GPU time lost per preemption. The inputs are built as `services/training/cluster_state.py`
  builds them: a queued job's time is its creation time (requeues included)
  and its runtime the whole estimate; a running job's expected end is its
  attempt's start plus the whole estimate (`policy.expected_end` moves it
  past "now" when the job overran), its progress the attempt's elapsed time
  over the estimate, its last checkpoint the job's newest (every
  `--checkpoint-every-s`, 30 min, of training, and the one written on
  SIGTERM), else the attempt's start. The loop ticks every 0.5 s; here the
  policy runs at every event time (arrivals, ends, victims' exits), on a
  60 s tick, and at the moment each job with a target wait becomes overdue.

Figures per policy: GPU utilization (busy GPU-hours / GPUs x simulated
hours) next to the trace's offered load (GPU-seconds the arrivals could have
used inside the simulated window, each job's runtime cut at the end of the
window, over the same capacity), useful work (busy minus the stop and
restore time of preemptions) as a fraction of the offered load, wait from
arrival to first start per tier and per class (p50, p95, max; a job still
queued at the end counts with its wait so far), the longest time any job
spent queued (requeues included), preemptions and lost GPU-hours (stop +
restore), jobs finished, and diagnostics: how often the blocked head's
reservation said "now" although the head did not fit, how often a job was
overdue while the head was not, how many victims were back on GPUs before
the job they made room for.

Then the tuneforge decision time per tick at scale: a full cluster of
running jobs drawn from the trace's mix and `--queue-size` (10,000) queued
jobs with the trace's mix that arrived over the last 24 hours; for `--ticks`
ticks one minute apart (jobs end, the decision is applied, new arrivals keep
the queue full; victims are requeued at the next tick) the time of one
`policy.decide` call is measured, wall clock and CPU, and a full
`order_queue` sort of the queue for comparison. Building the inputs, which
the scheduler loop reads from its tables, is not timed; the queue index is
kept up to date as jobs come and go, as a long-lived scheduler would. If the
goal is missed, or with `--profile`, the same ticks run again under cProfile
and the functions where the time goes are printed.

The issue's goals are printed next to the figures as met / NOT met; nothing
is asserted. Figures go to docs/benchmarks-scheduler.md.

Capacity pools:

    python benchmarks/scheduler_sim.py --pools [--seed 2] [--days 7] [--spot-share 0.75]
        [--spot-price 1.64] [--on-demand-price 4.10] [--spot-reclaims-per-node-hour 0.05]
        [--sweep-reclaims 0.01,0.05,0.2] [--sweep-max-preemptions 0,4,10]

One trace (seed 2 unless `--seed` says otherwise), the same nodes and the same
tuneforge policy three ways: "on-demand only" (every node on demand, every
job `capacity=on_demand`), "spot only" (every node spot, every job
`capacity=spot`: requeued onto spot however often it is reclaimed) and
"auto" (`--spot-share` of the nodes spot, the rest on demand, every job
`capacity=auto` with its deadline). Each job's `QueuedJob.pools` comes from
`pools.allowed_pools` as `services/training/cluster_state.py` builds it: its ask carries the
nodes it spans (gpus // gpus_per_node for a multi-node job, else 1) and its
spot preemptions so far, only the reclaims of its attempts on spot (as
`state.spot_preemptions` counts them: not the scheduler's own preemptions
for premium jobs, nor moves off spot) and when it was last queued
(`waiting_since`: the end of its last attempt, `max(Attempt.ended_at)`, None
if it never ran); its runtime is the estimate less the
share of the work its newest checkpoint holds (`state.work_done`). In every
decision the running auto jobs on spot that `pools.at_risk` flags, given the
work they have left by their progress (the estimate times the share of the
work not done: what the trainer's steps measure), checkpoint and are
requeued, as the loop's `_move_off_spot` does. Deadlines: arrival + U(2, 6)
x the job's true runtime + 1 h (`--deadline-slack`,
`--deadline-allowance-s`), drawn from a generator of their own. Spot nodes
are reclaimed, each as a Poisson process (`--spot-reclaims-per-node-hour`,
also the spot pool's preemption rate): a notice (`--reclaim-notice-s`, 120 s
as on AWS) during which nothing new starts there and the attempts on it get
SIGTERM, checkpoint and exit after `--stop-s` (when the notice is shorter,
they are killed and lose the training since their last periodic
checkpoint); then the node is gone and comes back `--replace-s` (10 min)
later. Optionally, droughts (`--spot-droughts-per-week`) reclaim a share of
the spot nodes at once for hours. Arrivals stop after `--days`; every job
then runs to its end. Printed per scenario: cost (each attempt's GPU-hours,
start to exit, at its pool's price), saving against on-demand only, deadline
misses, reclaims and preemptions by cause, the jobs moved off spot (and how
often one was), the jobs the preemption allowance kept off spot and those
that went back to it (after what wait), GPU-hours lost to preemptions,
the share of GPU-hours on spot, waits, the most preempted job and the missed
deadlines; the goals as met / NOT met; optionally sweeps of the reclaim rate
and of `--spot-max-preemptions`.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import heapq
import io
import math
import os
import platform
import pstats
import random
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType

from tuneforge.planning import policy
from tuneforge.planning.policy import (
    TIER_RANK,
    Hold,
    Node,
    PolicyConfig,
    QueuedJob,
    QueueIndex,
    Reservation,
    RunningJob,
    decide,
    order_queue,
    place,
    waited_too_long,
)
from tuneforge.planning.pools import (
    ON_DEMAND,
    SPOT,
    CapacityAsk,
    Pool,
    SpotRules,
    allowed_pools,
    at_risk,
    preemption_allowance,
)

DAY = 86400.0
HOUR = 3600.0
NODE_GPUS = 8


@dataclass(frozen=True)
class JobClass:
    name: str
    share: float
    gpus: int
    gpus_per_node: int
    mean_s: float


CLASSES = (
    JobClass("small-lora", 0.70, 1, 0, 15 * 60.0),
    JobClass("medium-lora", 0.20, 2, 0, 2 * HOUR),
    JobClass("70b-lora", 0.09, 4, 0, 4 * HOUR),
    JobClass("full-ft", 0.01, 32, NODE_GPUS, 24 * HOUR),
)
TIERS = ("premium", "standard", "free")
TIER_SHARES = {"premium": 0.25, "standard": 0.60, "free": 0.15}
TENANTS_PER_TIER = {"premium": 4, "standard": 12, "free": 4}


def tenants() -> list[tuple[str, str, float]]:
    """(tenant, tier, share of all jobs): within a tier a tenant's share is proportional to 1/k."""
    out = []
    for tier in TIERS:
        count = TENANTS_PER_TIER[tier]
        weights = [1.0 / k for k in range(1, count + 1)]
        for k, weight in enumerate(weights, start=1):
            out.append((f"{tier[0]}{k:02d}", tier, TIER_SHARES[tier] * weight / sum(weights)))
    return out


@dataclass(frozen=True)
class TraceJob:
    job_id: str
    tenant: str
    tier: str
    cls: str
    gpus: int
    gpus_per_node: int
    arrival: float
    work_s: float  # true runtime
    estimate_s: float  # what the policy is told


class JobDrawer:
    """Draws jobs with the trace's class, tier/tenant and runtime mix."""

    def __init__(self, rng: random.Random, runtime_sigma: float, estimate_sigma: float) -> None:
        self.rng = rng
        self.runtime_sigma = runtime_sigma
        self.estimate_sigma = estimate_sigma
        self.tenants = tenants()
        self.count = 0

    def draw(self, arrival: float) -> TraceJob:
        rng = self.rng
        cls = rng.choices(CLASSES, weights=[c.share for c in CLASSES])[0]
        tenant, tier, _ = rng.choices(self.tenants, weights=[t[2] for t in self.tenants])[0]
        sigma = self.runtime_sigma
        work = rng.lognormvariate(math.log(cls.mean_s) - sigma * sigma / 2, sigma)
        estimate = work * rng.lognormvariate(0.0, self.estimate_sigma)
        self.count += 1
        return TraceJob(f"j{self.count:06d}", tenant, tier, cls.name, cls.gpus, cls.gpus_per_node, arrival,
                        work, estimate)


def build_trace(args: argparse.Namespace) -> list[TraceJob]:
    """A Poisson process with a piecewise-constant rate (thinning from the burst rate)."""
    rng = random.Random(args.seed)
    drawer = JobDrawer(rng, args.runtime_sigma, args.estimate_sigma)
    base = args.jobs_per_day / (24 - 1 + args.burst_factor) / HOUR  # per second
    peak = base * args.burst_factor
    end = args.days * DAY
    jobs, now = [], 0.0
    while True:
        now += rng.expovariate(peak)
        if now >= end:
            return jobs
        rate = peak if int(now // HOUR) % 24 == args.burst_hour else base
        if rng.random() < rate / peak:
            jobs.append(drawer.draw(now))


# ---- cluster bookkeeping (the simulator's own; the policy never mutates its inputs) ----

def new_nodes(count: int) -> list[Node]:
    return [Node(f"n{i:02d}", NODE_GPUS, set(range(NODE_GPUS))) for i in range(count)]


def allocate(by_name: dict[str, Node], assignment: dict[str, tuple[int, ...]]) -> None:
    for name, ids in assignment.items():
        node = by_name[name]
        missing = set(ids) - node.free
        if missing:
            raise RuntimeError(f"GPUs {sorted(missing)} on {name} are not free")
        node.free.difference_update(ids)


def release(by_name: dict[str, Node], assignment: dict[str, tuple[int, ...]]) -> None:
    for name, ids in assignment.items():
        by_name[name].free.update(ids)


def snapshot(nodes: Sequence[Node]) -> list[Node]:
    return [Node(node.name, node.total, set(node.free)) for node in nodes]


# ---- the three policies: queue, nodes, running jobs -> starts (+ jobs to preempt) ----

@dataclass
class Decision:
    starts: list[tuple[QueuedJob, dict]] = field(default_factory=list)
    preemptions: list[tuple[QueuedJob, list[RunningJob], dict]] = field(default_factory=list)
    holds: list[Hold] = field(default_factory=list)
    blocked: QueuedJob | None = None
    reservation: Reservation | None = None


def in_order_until_blocked(ordered: Sequence[QueuedJob], nodes: Sequence[Node]) -> Decision:
    """Start jobs in the given order while they fit; the first that does not blocks the rest."""
    free = snapshot(nodes)
    by_name = {node.name: node for node in free}
    decision = Decision()
    for job in ordered:
        assignment = place(job, free)
        if assignment is None:
            decision.blocked = job
            break
        allocate(by_name, assignment)
        decision.starts.append((job, assignment))
    return decision


def decide_fifo(queue, nodes, running, stopping, holds, now, usage, config, timings=None) -> Decision:
    return in_order_until_blocked(sorted(queue, key=lambda j: (j.queued_at, j.job_id)), nodes)


def decide_strict(queue, nodes, running, stopping, holds, now, usage, config, timings=None) -> Decision:
    return in_order_until_blocked(
        sorted(queue, key=lambda j: (TIER_RANK.get(j.tier, 2), j.queued_at, j.job_id)), nodes)


def decide_tuneforge(queue: QueueIndex, nodes: Sequence[Node], running: Sequence[RunningJob],
                     stopping: set[str], holds: dict[str, Hold], now: float, usage: dict[str, float],
                     config: PolicyConfig, timings: dict[str, list[float]] | None = None) -> Decision:
    """One tick of the scheduler loop (`Scheduler._admit_queued_jobs`): `policy.decide`
    on the queue index, the running jobs, those already stopping and the current holds."""
    t0, c0 = time.perf_counter(), time.thread_time()
    result = decide(queue, nodes, running, now, config, usage, stopping=stopping, holds=holds)
    t1, c1 = time.perf_counter(), time.thread_time()
    if timings is not None:
        timings["decide"].append(t1 - t0)
        timings["decide (CPU)"].append(c1 - c0)
    return Decision(starts=list(result.starts), preemptions=list(result.preemptions),
                    holds=result.holds(now, config), blocked=result.blocked, reservation=result.reservation)


POLICIES = {"fifo": decide_fifo, "strict": decide_strict, "tuneforge": decide_tuneforge}


# ---- the simulation ----

@dataclass
class JobState:
    trace: TraceJob
    done_s: float = 0.0  # training done so far (checkpointed)
    first_start: float | None = None
    finished_at: float | None = None
    enqueued_at: float = 0.0  # when it last entered the queue
    queued_total: float = 0.0  # time spent queued, requeues included
    preemptions: int = 0
    attempt: int = 0
    checkpoint_at: float | None = None  # the checkpoint an earlier attempt wrote on SIGTERM
    preempted_for: str | None = None  # the queued job its last preemption made room for


@dataclass
class Attempt:
    job: JobState
    number: int
    placement: dict
    start: float
    restore_s: float  # loading the model and the checkpoint before training resumes
    view: RunningJob  # what plan sees: placement, start + estimate
    stop_at: float | None = None  # SIGTERM received: training stopped, checkpointing until the exit

    @property
    def gpus(self) -> int:
        return sum(len(ids) for ids in self.placement.values())

    def trained(self, now: float) -> float:
        until = now if self.stop_at is None else min(now, self.stop_at)
        return max(0.0, until - self.start - self.restore_s)

    def end_time(self) -> float:
        return self.start + self.restore_s + (self.job.trace.work_s - self.job.done_s)

    def last_checkpoint(self, now: float, every: float) -> float:
        """As `services/training/cluster_state.py` reads it: the job's newest checkpoint, else the attempt's start."""
        trained = self.trained(now)
        if trained >= every:
            return self.start + self.restore_s + (trained // every) * every
        return self.job.checkpoint_at if self.job.checkpoint_at is not None else self.start


class UsageWindow:
    """Each tenant's GPU-hours in the last 24 h of simulated time."""

    def __init__(self) -> None:
        self.segments: list[tuple[str, int, float, float]] = []  # tenant, gpus, start, end

    def add(self, tenant: str, gpus: int, start: float, end: float) -> None:
        self.segments.append((tenant, gpus, start, end))

    def at(self, now: float, running: Sequence[Attempt]) -> dict[str, float]:
        since = now - DAY
        if self.segments and self.segments[0][3] < since - DAY:
            self.segments = [s for s in self.segments if s[3] > since]
        usage: dict[str, float] = {}
        for tenant, gpus, start, end in self.segments:
            if end > since:
                usage[tenant] = usage.get(tenant, 0.0) + gpus * (end - max(start, since)) / HOUR
        for attempt in running:
            tenant = attempt.job.trace.tenant
            usage[tenant] = usage.get(tenant, 0.0) + attempt.gpus * (now - max(attempt.start, since)) / HOUR
        return usage


# at one instant: ends and exits first, then arrivals, deadlines and the tick
END, EXIT, ARRIVAL, DEADLINE, TICK = range(5)


def queue_job(queue: dict, index: QueueIndex, state: JobState, now: float) -> None:
    """Queue the job as services/training/cluster_state.py builds it: queued since it was created, its whole
    estimate."""
    t = state.trace
    queue[t.job_id] = QueuedJob(t.job_id, t.tenant, t.tier, t.gpus, t.arrival, t.estimate_s, t.gpus_per_node)
    index.add(queue[t.job_id])
    state.enqueued_at = now


def take_from_queue(state: JobState, assignment: dict, now: float, queue: dict, index: QueueIndex,
                    by_name: dict[str, Node], restore_s: float) -> tuple[float, RunningJob]:
    """A queued job starts an attempt on `assignment`: its GPUs taken, its wait counted; returns
    the attempt's restore time (a resumed job reloads its checkpoint) and the scheduler's view of it."""
    job_id = state.trace.job_id
    del queue[job_id]
    index.remove(job_id)
    allocate(by_name, assignment)
    state.queued_total += now - state.enqueued_at
    if state.first_start is None:
        state.first_start = now
    state.attempt += 1
    restore = restore_s if state.preemptions else 0.0
    view = RunningJob(job_id, state.trace.tenant, state.trace.tier, assignment, now,
                      now + state.trace.estimate_s, now, 0.0, queued_at=state.trace.arrival)
    return restore, view


def simulate(name: str, trace: Sequence[TraceJob], args: argparse.Namespace, config: PolicyConfig) -> dict:
    decide_fn = POLICIES[name]
    ours = name.startswith("tuneforge")
    holds: dict[str, Hold] = {}  # as the loop keeps them: GPUs being freed for a job
    horizon = args.days * DAY
    nodes = new_nodes(args.nodes)
    by_name = {node.name: node for node in nodes}
    jobs = {t.job_id: JobState(t) for t in trace}
    queue: dict[str, QueuedJob] = {}
    index = QueueIndex()  # the same queue, as the loop builds it for the policy
    running: dict[str, Attempt] = {}
    usage = UsageWindow()
    events: list[tuple[float, int, int, str, int]] = []
    seq = 0

    def push(at: float, kind: int, job_id: str = "", number: int = 0) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (at, kind, seq, job_id, number))

    for t in trace:
        push(t.arrival, ARRIVAL, t.job_id)
        target = config.target_wait_s.get(t.tier)
        if ours and target is not None:  # the loop ticks every 0.5 s: be there when it is due
            push(t.arrival + target + 1e-3, DEADLINE, t.job_id)
    push(args.tick_s, TICK)
    busy = lost = 0.0  # GPU-seconds inside the window
    decision_s: list[float] = []
    diag = {"blocked": 0, "no_reservation": 0, "reservation_past": 0, "preemptions": 0, "rounds": 0,
            "victim_gpus": 0, "preempting_gpus": 0, "multi_node_victims": 0, "restarted_ahead": 0,
            "preempted_before_due": 0, "hold_starts": 0}
    policy_calls = 0

    def enqueue(state: JobState, now: float) -> None:
        queue_job(queue, index, state, now)

    def start(job_id: str, assignment: dict, now: float) -> None:
        state = jobs[job_id]
        restore, view = take_from_queue(state, assignment, now, queue, index, by_name, args.restore_s)
        if state.preempted_for is not None and state.preempted_for in queue:
            diag["restarted_ahead"] += 1  # back on GPUs before the job it made room for
        state.preempted_for = None
        attempt = Attempt(state, state.attempt, assignment, now, restore, view)
        running[job_id] = attempt
        push(attempt.end_time(), END, job_id, attempt.number)

    def finish_attempt(attempt: Attempt, now: float) -> None:
        nonlocal busy, lost
        del running[attempt.job.trace.job_id]
        release(by_name, attempt.placement)
        trained = attempt.trained(now)
        busy += attempt.gpus * (now - attempt.start)
        lost += attempt.gpus * (now - attempt.start - trained)
        attempt.job.done_s = min(attempt.job.trace.work_s, attempt.job.done_s + trained)
        usage.add(attempt.job.trace.tenant, attempt.gpus, attempt.start, now)

    def views_now(now: float) -> list[RunningJob]:
        """As services/training/cluster_state.py builds them: placement, start + estimate, newest checkpoint,
        progress."""
        return [replace(a.view, last_checkpoint_at=a.last_checkpoint(now, args.checkpoint_every_s),
                        progress=min(1.0, (now - a.start) / a.job.trace.estimate_s))
                for a in running.values()]

    started_wall = time.perf_counter()
    while events and events[0][0] <= horizon:
        now = events[0][0]
        while events and events[0][0] == now:
            _, kind, _, job_id, number = heapq.heappop(events)
            attempt = running.get(job_id)
            if kind == ARRIVAL:
                enqueue(jobs[job_id], now)
            elif kind == END and attempt is not None and attempt.number == number and attempt.stop_at is None:
                finish_attempt(attempt, now)
                attempt.job.finished_at = now
            elif kind == EXIT and attempt is not None and attempt.number == number:
                finish_attempt(attempt, now)  # checkpointed: requeued, resumes from here
                attempt.job.checkpoint_at = now
                enqueue(attempt.job, now)
            elif kind == TICK:
                push(now + args.tick_s, TICK)
        if not queue:
            continue
        usage_now = usage.at(now, list(running.values())) if ours else {}
        stopping = {job_id for job_id, a in running.items() if a.stop_at is not None}
        holds = {job_id: h for job_id, h in holds.items() if job_id in queue and h.until > now}
        views = views_now(now) if ours else []
        began = time.perf_counter()
        decision = decide_fn(index if ours else list(queue.values()), nodes, views, stopping, holds, now, usage_now,
                          config)
        decision_s.append(time.perf_counter() - began)
        policy_calls += 1
        if decision.blocked is not None:
            diag["blocked"] += 1
            if ours and decision.reservation is None:
                diag["no_reservation"] += 1
            elif decision.reservation is not None and decision.reservation.start <= now:
                diag["reservation_past"] += 1  # due now by the estimates, yet it does not fit
        for job, assignment in decision.starts:
            if job.job_id in holds:
                diag["hold_starts"] += 1
                del holds[job.job_id]
            start(job.job_id, assignment, now)
        for hold in decision.holds:
            holds[hold.job_id] = hold
        for for_job, victims, _landing in decision.preemptions:
            if not victims:
                continue
            diag["rounds"] += 1
            diag["preempting_gpus"] += for_job.gpus
            if not waited_too_long(for_job, now, config):
                diag["preempted_before_due"] += 1  # its estimated start was past the target
            for victim in victims:
                attempt = running[victim.job_id]
                attempt.stop_at = now
                attempt.job.preemptions += 1
                attempt.job.preempted_for = for_job.job_id
                push(now + args.stop_s, EXIT, victim.job_id, attempt.number)
                diag["preemptions"] += 1
                diag["victim_gpus"] += attempt.gpus
                diag["multi_node_victims"] += len(attempt.placement) > 1
    for attempt in list(running.values()):  # count what runs at the end up to the horizon
        trained = attempt.trained(horizon)
        busy += attempt.gpus * (horizon - attempt.start)
        lost += attempt.gpus * (horizon - attempt.start - trained)
    wall = time.perf_counter() - started_wall

    capacity = args.nodes * NODE_GPUS * horizon
    offered = sum(t.gpus * min(t.work_s, horizon - t.arrival) for t in trace)
    waits: dict[str, list[float]] = {tier: [] for tier in TIERS}  # every tier and class, if only empty
    class_waits: dict[str, list[float]] = {c.name: [] for c in CLASSES}
    max_queued = (0.0, "")
    for state in jobs.values():
        t = state.trace
        wait = (state.first_start if state.first_start is not None else horizon) - t.arrival
        waits.setdefault(t.tier, []).append(wait)
        class_waits.setdefault(t.cls, []).append(wait)
        queued = state.queued_total + (horizon - state.enqueued_at if t.job_id in queue else 0.0)
        max_queued = max(max_queued, (queued, t.job_id))
    return {
        "name": name, "wall_s": wall, "policy_calls": policy_calls,
        "utilization": busy / capacity, "useful_utilization": (busy - lost) / capacity,
        "offered": offered / capacity, "lost_gpu_h": lost / HOUR, "preemptions": diag["preemptions"],
        "max_preemptions_one_job": max(s.preemptions for s in jobs.values()),
        "finished": sum(1 for s in jobs.values() if s.finished_at is not None),
        "running_at_end": len(running), "queued_at_end": len(queue), "arrived": len(trace),
        "never_started": sum(1 for s in jobs.values() if s.first_start is None),
        "waits": waits, "class_waits": class_waits, "max_queued": max_queued,
        "decision_s": decision_s, "diag": diag, "longest": describe(jobs[max_queued[1]]), "jobs": jobs,
    }


def describe(state: JobState) -> str:
    t = state.trace
    start = f"first start after {duration(state.first_start - t.arrival)}" if state.first_start is not None \
        else "never started"
    return (f"{t.job_id}: {t.tier} {t.cls} ({t.gpus} GPUs) of {t.tenant}, arrived at "
            f"day {t.arrival // DAY:.0f} {(t.arrival % DAY) / HOUR:05.2f} h, {start}, preempted {state.preemptions}x")


# ---- decision time at scale ----

PARTS = ("decide", "decide (CPU)", "order_queue alone", "QueueIndex rebuilt")


def decision_bench(args: argparse.Namespace, config: PolicyConfig, profiler: cProfile.Profile | None = None) -> dict:
    """A full cluster, `--queue-size` queued jobs; `--ticks` ticks one minute apart."""
    rng = random.Random(args.seed + 1)
    drawer = JobDrawer(rng, args.runtime_sigma, args.estimate_sigma)
    nodes = new_nodes(args.nodes)
    by_name = {node.name: node for node in nodes}
    now = 30 * DAY
    running: dict[str, tuple[TraceJob, RunningJob, float]] = {}  # id -> job, view, true end
    misses = 0
    while misses < 200:  # fill the cluster: draw until 200 draws in a row do not fit
        job = drawer.draw(now)
        assignment = place(QueuedJob(job.job_id, job.tenant, job.tier, job.gpus, now, job.estimate_s,
                                     job.gpus_per_node), nodes)
        if assignment is None:
            misses += 1
            continue
        misses = 0
        allocate(by_name, assignment)
        began = now - rng.uniform(0.0, job.work_s)
        view = RunningJob(job.job_id, job.tenant, job.tier, assignment, began, began + job.estimate_s, began, 0.0,
                          queued_at=job.arrival)
        running[job.job_id] = (job, view, began + job.work_s)
    queue: dict[str, QueuedJob] = {}
    index = QueueIndex()
    work: dict[str, TraceJob] = {}

    def add_queued(job: TraceJob) -> None:
        work[job.job_id] = job
        queue[job.job_id] = QueuedJob(job.job_id, job.tenant, job.tier, job.gpus, job.arrival, job.estimate_s,
                                      job.gpus_per_node)
        index.add(queue[job.job_id])

    for arrival in sorted(now - rng.uniform(0.0, DAY) for _ in range(args.queue_size)):
        add_queued(drawer.draw(arrival))
    setup = {"running": len(running), "busy_gpus": sum(NODE_GPUS - len(node.free) for node in nodes),
             "queued": len(queue),
             "overdue": sum(1 for j in queue.values() if waited_too_long(j, now + args.tick_s, config))}
    timings: dict[str, list[float]] = {part: [] for part in PARTS}
    started = preempted = 0
    stopping: set[str] = set()
    holds: dict[str, Hold] = {}
    for _ in range(args.ticks):
        now += args.tick_s
        for job_id in sorted(stopping):  # checkpointed and exited since the last tick: requeued
            job, view, _ = running.pop(job_id)
            release(by_name, view.placement)
            add_queued(job)
        stopping = set()
        for job_id, (_job, view, end) in list(running.items()):
            if end <= now:
                release(by_name, view.placement)
                del running[job_id]
        while len(queue) < args.queue_size:
            add_queued(drawer.draw(now))
        usage: dict[str, float] = {}
        views = []
        for job, view, _ in running.values():
            ran = now - view.started_at
            usage[job.tenant] = usage.get(job.tenant, 0.0) + \
                sum(len(ids) for ids in view.placement.values()) * min(ran, DAY) / HOUR
            views.append(replace(view, last_checkpoint_at=view.started_at + (ran // args.checkpoint_every_s)
                                 * args.checkpoint_every_s, progress=min(1.0, ran / job.estimate_s)))
        holds = {job_id: h for job_id, h in holds.items() if job_id in queue and h.until > now}
        if profiler is not None:
            profiler.enable()
        decision = decide_tuneforge(index, nodes, views, stopping, holds, now, usage, config, timings)
        if profiler is not None:
            profiler.disable()
        else:  # a full sort of the queue, for comparison; and the index built from scratch,
            # as the scheduler loop does each tick from the rows it reads (in arrival order)
            began = time.perf_counter()
            order_queue(list(queue.values()), config, usage)
            timings["order_queue alone"].append(time.perf_counter() - began)
            rows = sorted(queue.values(), key=lambda j: (j.queued_at, j.seq, j.job_id))
            began = time.perf_counter()
            QueueIndex(rows)
            timings["QueueIndex rebuilt"].append(time.perf_counter() - began)
        for hold in decision.holds:
            holds[hold.job_id] = hold
        for job, assignment in decision.starts:
            holds.pop(job.job_id, None)
            del queue[job.job_id]
            index.remove(job.job_id)
            trace_job = work.pop(job.job_id)
            allocate(by_name, assignment)
            view = RunningJob(job.job_id, job.tenant_id, job.tier, assignment, now, now + job.runtime_s, now, 0.0,
                              queued_at=job.queued_at)
            running[job.job_id] = (trace_job, view, now + trace_job.work_s)
            started += 1
        stopping = {victim.job_id for _job, victims, _landing in decision.preemptions for victim in victims}
        preempted += len(stopping)
    return {"setup": setup, "timings": timings, "started": started, "preempted": preempted}


# ---- output ----

def pct(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 2 * HOUR:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / HOUR:.1f} h"


def met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def machine() -> str:
    cpu = platform.processor()
    memory = ""
    try:
        cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name")), cpu)
        kib = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                   if line.startswith("MemTotal"))
        memory = f", {kib / 2**20:.1f} GiB"
    except (OSError, StopIteration):
        pass
    load = ", load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    return f"{os.cpu_count()} cores, {cpu}{memory}; Python {platform.python_version()}{load}"


def wait_stat(waits: Sequence[float], q: float | None = None) -> str:
    """A percentile of the waits (their max without `q`); "-" when the trace has none of those jobs."""
    if not waits:
        return "-"
    return duration(max(waits) if q is None else pct(waits, q))


def print_results(results: list[dict]) -> None:
    names = [r["name"] for r in results]
    width = 20
    head = f"{'':34}" + "".join(f"{name:>{width}}" for name in names)
    print(head)

    def row(label: str, values: list[str]) -> None:
        print(f"{label:34}" + "".join(f"{value:>{width}}" for value in values))

    row("GPU utilization", [f"{r['utilization']:.1%}" for r in results])
    row("  useful (minus stop + restore)", [f"{r['useful_utilization']:.1%}" for r in results])
    row("offered load", [f"{r['offered']:.1%}" for r in results])
    row("useful / offered", [f"{r['useful_utilization'] / r['offered']:.1%}" for r in results])
    for tier in TIERS:
        for q in (50, 95):
            row(f"wait p{q} {tier}", [wait_stat(r["waits"][tier], q) for r in results])
        row(f"wait max {tier}", [wait_stat(r["waits"][tier]) for r in results])
    for cls in CLASSES:
        row(f"wait p95 {cls.name}", [wait_stat(r["class_waits"][cls.name], 95) for r in results])
        row(f"wait max {cls.name}", [wait_stat(r["class_waits"][cls.name]) for r in results])
    row("longest time queued (any job)", [duration(r["max_queued"][0]) for r in results])
    row("preemptions", [str(r["preemptions"]) for r in results])
    row("  most of one job", [str(r["max_preemptions_one_job"]) for r in results])
    row("lost GPU-hours (stop + restore)", [f"{r['lost_gpu_h']:.1f}" for r in results])
    row("jobs arrived", [str(r["arrived"]) for r in results])
    row("jobs finished", [str(r["finished"]) for r in results])
    row("running / queued at the end", [f"{r['running_at_end']} / {r['queued_at_end']}" for r in results])
    row("never started", [str(r["never_started"]) for r in results])
    row("policy calls", [str(r["policy_calls"]) for r in results])
    row("decision ms p50 (this trace)", [f"{pct(r['decision_s'], 50) * 1e3:.2f}" for r in results])
    row("decision ms p95 (this trace)", [f"{pct(r['decision_s'], 95) * 1e3:.2f}" for r in results])
    row("decision ms max (this trace)", [f"{max(r['decision_s']) * 1e3:.2f}" for r in results])
    row("calls with a blocked head", [str(r["diag"]["blocked"]) for r in results])
    row("  head reserved 'now' but not free", [str(r["diag"]["reservation_past"]) for r in results])
    row("  head without a reservation", [str(r["diag"]["no_reservation"]) for r in results])
    row("preemption rounds", [str(r["diag"]["rounds"]) for r in results])
    row("  before the job was overdue", [str(r["diag"]["preempted_before_due"]) for r in results])
    row("starts on held GPUs", [str(r["diag"]["hold_starts"]) for r in results])
    row("  victims back before their job", [str(r["diag"]["restarted_ahead"]) for r in results])
    row("GPUs preempted / of preemptors", [f"{r['diag']['victim_gpus']} / {r['diag']['preempting_gpus']}"
                                           for r in results])
    row("  victims that were multi-node", [str(r["diag"]["multi_node_victims"]) for r in results])
    row("simulated in (wall s)", [f"{r['wall_s']:.1f}" for r in results])
    print("longest time queued:")
    for r in results:
        print(f"  {r['name']:18} {duration(r['max_queued'][0])}, {r['longest']}")


# ---- capacity pools: spot, on-demand and fallback (--pools) ----
#
# Prices and the reclaim rate are assumptions from public figures; docs/benchmarks-scheduler.md
# cites them. On demand: AWS p4d.24xlarge (8 A100) at $32.77 an hour, $4.10 per GPU-hour. Spot: 60%
# off, the low end of Google Cloud's 60-91% spot discount and below the GPU spot discounts reported
# for AWS (about 66-80%). Reclaims: 0.05 per node-hour, a node reclaimed every 20 hours on average —
# far above what the worst bucket of AWS's Spot Instance Advisor (">20%" a month) means for a node
# that runs all month (0.0003 per hour); `--sweep-reclaims` shows what other rates do.
ON_DEMAND_PRICE = 4.10
SPOT_PRICE = 1.64
RECLAIMS_PER_NODE_HOUR = 0.05
SPOT_POOL, ON_DEMAND_POOL = "spot", "on-demand"
STOP_CAUSES = ("reclaim", "move", "tier")  # a provider's reclaim, a move off spot, a preemption for a premium job


@dataclass(frozen=True)
class Scenario:
    name: str
    capacity: str  # what every job asks for (`resources.capacity`)
    spot_nodes: int


def scenarios(args: argparse.Namespace) -> list[Scenario]:
    """The same inventory three ways: all on demand, all spot, and the spot share of it spot."""
    spot = min(args.nodes, max(0, round(args.nodes * args.spot_share)))
    return [Scenario("on-demand only", ON_DEMAND, 0), Scenario("spot only", SPOT, args.nodes),
            Scenario("auto", "auto", spot)]


def pool_inventory(args: argparse.Namespace, spot_nodes: int, rate: float) -> tuple[list[Node], dict[str, Pool]]:
    """`args.nodes` nodes, the first `spot_nodes` of them spot; the pools as an operator would
    configure them (the spot pool's preemption rate is the simulated one)."""
    pools = {}
    if spot_nodes:
        pools[SPOT_POOL] = Pool(SPOT_POOL, SPOT, args.spot_price, rate)
    if spot_nodes < args.nodes:
        pools[ON_DEMAND_POOL] = Pool(ON_DEMAND_POOL, ON_DEMAND, args.on_demand_price)
    nodes = [Node(f"n{i:02d}", NODE_GPUS, set(range(NODE_GPUS)), SPOT_POOL if i < spot_nodes else ON_DEMAND_POOL)
             for i in range(args.nodes)]
    return nodes, pools


def draw_deadlines(trace: Sequence[TraceJob], args: argparse.Namespace) -> dict[str, float]:
    """Each job's deadline: arrival + U(lo, hi) x its true runtime + a fixed allowance, from a
    generator of its own, so the trace is the one `--seed` draws for the other runs."""
    lo, hi = (float(v) for v in args.deadline_slack.split(","))
    rng = random.Random(f"deadlines-{args.seed}")
    return {t.job_id: t.arrival + rng.uniform(lo, hi) * t.work_s + args.deadline_allowance_s for t in trace}


@dataclass
class PoolAttempt(Attempt):
    pool: str = ""
    restore_cause: str = ""  # what stopped the attempt before this one (its restore is lost to that)
    cause: str = ""  # what stopped this one
    checkpointed: bool = True  # its stop wrote a checkpoint (else the training since the last periodic one is lost)
    reclaimed: bool = False  # its node was reclaimed under it: a spot preemption (`state.spot_preemptions`)


# at one instant: ends and exits first, then nodes leaving and coming back, reclaims and droughts,
# arrivals, target waits coming due, the tick
P_END, P_EXIT, P_GONE, P_BACK, P_RECLAIM, P_DROUGHT, P_ARRIVAL, P_DUE, P_TICK = range(9)


def simulate_pools(scenario: Scenario, trace: Sequence[TraceJob], deadlines: dict[str, float],
                   args: argparse.Namespace, config: PolicyConfig, rate: float) -> dict:
    """The tuneforge policy (`policy.decide`) on `trace` with capacity pools, as the scheduler loop
    runs it: each queued job's `QueuedJob.pools` from `pools.allowed_pools` (its nodes, the work its
    checkpoint leaves, its spot preemptions counted as `state.spot_preemptions` counts them: reclaims
    of its attempts on spot, not the scheduler's own preemptions), running auto jobs on spot that
    `pools.at_risk` flags on the work they have left checkpoint and are requeued (`_move_off_spot`).
    Spot nodes are reclaimed (a Poisson process per node); the simulation runs until every job has
    finished."""
    nodes, pools = pool_inventory(args, scenario.spot_nodes, rate)
    pool_list = list(pools.values())
    rules = SpotRules(max_preemptions=args.spot_max_preemptions, max_wait_s=args.spot_max_wait_s)
    by_name = {node.name: node for node in nodes}
    node_pool = {node.name: node.pool for node in nodes}
    every = args.checkpoint_every_s
    jobs = {t.job_id: JobState(t) for t in trace}
    # as `PoolSetup.ask` is given them (`state._nodes`: gpus // gpus_per_node for a multi-node job, else 1)
    asks = {t.job_id: CapacityAsk(scenario.capacity, deadlines[t.job_id], None, 0, t.arrival,
                                  max(1, t.gpus // t.gpus_per_node) if t.gpus_per_node else 1) for t in trace}
    spot_preempted = dict.fromkeys(jobs, 0)  # reclaims of its attempts on spot (`state.spot_preemptions`)
    kept_off: dict[str, float] = {}  # auto jobs spot's allowance kept off spot -> when it first did
    # of those, the ones that started on spot again (`_back_to_spot`) -> how long since their last exit (or
    # arrival) they had waited, and whether their deadline could no longer be met then
    returned: dict[str, tuple[float, bool]] = {}
    # when each job's last attempt ended (`max(Attempt.ended_at)`: its exit), None if it never ran: the
    # ask's `waiting_since`, as `read_state` passes it
    last_ended: dict[str, float | None] = dict.fromkeys(jobs)
    moved_off: Counter = Counter()  # per job, its attempts on spot `at_risk` moved off
    ran_on: dict[str, list[str]] = {job_id: [] for job_id in jobs}  # each attempt's pool, in order
    stopped_by: dict[str, Counter] = {job_id: Counter() for job_id in jobs}  # its preempted attempts, by cause
    last_cause = dict.fromkeys(jobs, "")
    queue: dict[str, QueuedJob] = {}
    index = QueueIndex()
    running: dict[str, PoolAttempt] = {}
    holds: dict[str, Hold] = {}
    usage = UsageWindow()
    draining: set[str] = set()  # reclaim notice received: nothing new starts there
    gone: set[str] = set()  # terminated, its replacement not there yet
    events: list[tuple[float, int, int, str, int]] = []
    seq = 0

    def push(at: float, kind: int, key: str = "", number: int = 0) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (at, kind, seq, key, number))

    # each spot node's reclaims: a generator per node name, so a node's reclaims are the same in every
    # scenario where it is spot; a drought takes a share of the spot nodes at once, for hours
    reclaim_rng = {node.name: random.Random(f"reclaims-{args.seed}-{node.name}") for node in nodes}
    drought_rng = random.Random(f"droughts-{args.seed}")  # when (the same in every scenario)
    drought_pick = random.Random(f"drought-nodes-{args.seed}")  # which nodes
    generation = {node.name: 0 for node in nodes}  # a node reclaimed by a drought drops its pending reclaim
    away = {node.name: args.replace_s for node in nodes}

    def next_reclaim(name: str, now: float) -> None:
        if rate > 0:
            push(now + reclaim_rng[name].expovariate(rate / HOUR), P_RECLAIM, name, generation[name])

    def next_drought(now: float) -> None:
        if args.spot_droughts_per_week > 0 and scenario.spot_nodes:
            push(now + drought_rng.expovariate(args.spot_droughts_per_week / (7 * DAY)), P_DROUGHT)

    for t in trace:
        push(t.arrival, P_ARRIVAL, t.job_id)
        target = config.target_wait_s.get(t.tier)
        if target is not None:
            push(t.arrival + target + 1e-3, P_DUE, t.job_id)
    for node in nodes:
        if node.pool == SPOT_POOL:
            next_reclaim(node.name, 0.0)
    next_drought(0.0)
    push(args.tick_s, P_TICK)

    gpu_s = dict.fromkeys(pools, 0.0)  # GPU-seconds billed per pool (attempts, start to exit)
    full_ft_s = dict.fromkeys(pools, 0.0)  # the same, of the full fine-tunes
    lost_s = dict.fromkeys(STOP_CAUSES, 0.0)  # GPU-seconds lost per cause: stop, restore, training discarded
    stops = dict.fromkeys(STOP_CAUSES, 0)
    reclaims = reclaims_hitting = droughts = 0
    gone_s = 0.0  # node-seconds spot nodes were away (terminated, not yet replaced) in the days of arrivals
    finished = 0
    policy_calls = 0

    def enqueue(state: JobState, now: float) -> None:
        queue_job(queue, index, state, now)

    def start(job_id: str, assignment: dict, now: float) -> None:
        state = jobs[job_id]
        restore, view = take_from_queue(state, assignment, now, queue, index, by_name, args.restore_s)
        attempt = PoolAttempt(state, state.attempt, assignment, now, restore, view,
                              pool=node_pool[min(assignment)], restore_cause=last_cause[job_id])
        if job_id in kept_off and job_id not in returned and pools[attempt.pool].kind == SPOT:
            since = last_ended[job_id] if last_ended[job_id] is not None else state.trace.arrival
            returned[job_id] = (now - since, now + work_left(state) > deadlines[job_id])
        ran_on[job_id].append(attempt.pool)
        running[job_id] = attempt
        push(attempt.end_time(), P_END, job_id, attempt.number)

    def stop(attempt: PoolAttempt, now: float, cause: str, checkpointed: bool = True) -> None:
        """SIGTERM: training stops; the attempt checkpoints and exits `--stop-s` later (or, without
        the time to, is killed when its node goes)."""
        state = attempt.job
        attempt.stop_at, attempt.cause, attempt.checkpointed = now, cause, checkpointed
        state.preemptions += 1
        last_cause[state.trace.job_id] = cause
        stops[cause] += 1
        stopped_by[state.trace.job_id][cause] += 1
        if cause == "reclaim":
            count_reclaim(attempt)
        elif cause == "move":
            moved_off[state.trace.job_id] += 1
        exit_at = now + (args.stop_s if checkpointed else args.reclaim_notice_s)
        push(exit_at, P_EXIT, state.trace.job_id, attempt.number)

    def finish_attempt(attempt: PoolAttempt, now: float) -> None:
        state = attempt.job
        del running[state.trace.job_id]
        release(by_name, attempt.placement)
        last_ended[state.trace.job_id] = now  # the loop's `_end_attempt` on the exit it observes
        held = attempt.gpus * (now - attempt.start)
        gpu_s[attempt.pool] += held
        if state.trace.gpus_per_node:
            full_ft_s[attempt.pool] += held
        trained = attempt.trained(now)
        kept = trained if attempt.checkpointed else (trained // every) * every
        restore = attempt.gpus * min(attempt.restore_s, now - attempt.start)
        if restore:
            lost_s[attempt.restore_cause] += restore
        if attempt.cause:
            lost_s[attempt.cause] += held - restore - attempt.gpus * kept
        state.done_s = min(state.trace.work_s, state.done_s + kept)
        usage.add(state.trace.tenant, attempt.gpus, attempt.start, now)

    def count_reclaim(attempt: PoolAttempt) -> None:
        """`state.spot_preemptions`: an attempt on spot whose node was reclaimed counts once (its
        handle's `reclaim_requested`), even if it was already stopping for another reason; the
        scheduler's own preemptions and moves off spot do not count."""
        if pools[attempt.pool].kind == SPOT and not attempt.reclaimed:
            attempt.reclaimed = True
            spot_preempted[attempt.job.trace.job_id] += 1

    def reclaim(name: str, now: float, away_s: float) -> None:
        """The provider takes a spot node back: a notice, then the node is gone for `away_s`."""
        nonlocal reclaims, reclaims_hitting
        reclaims += 1
        generation[name] += 1
        away[name] = away_s
        draining.add(name)
        on_node = [a for a in running.values() if name in a.placement]
        hit = [a for a in on_node if a.stop_at is None]
        reclaims_hitting += bool(hit)
        for victim in hit:  # checkpoint, if the notice leaves the time to
            stop(victim, now, "reclaim", args.stop_s <= args.reclaim_notice_s)
        for stopping_already in on_node:  # `_reclaim_draining` marks every active attempt on the node
            count_reclaim(stopping_already)
        push(now + args.reclaim_notice_s, P_GONE, name)

    def views_now(now: float) -> list[RunningJob]:
        return [replace(a.view, last_checkpoint_at=a.last_checkpoint(now, every),
                        progress=min(1.0, (now - a.start) / a.job.trace.estimate_s))
                for a in running.values()]

    def work_left(state: JobState, trained: float = 0.0) -> float:
        """The estimate less the share of the work done: `state.work_done` (the newest checkpoint's
        step over the total) for a queued job, the attempt's step over the total for a running one.
        Steps measure the true work, so the share is the true one."""
        return state.trace.estimate_s * max(0.0, 1 - (state.done_s + trained) / state.trace.work_s)

    def allowed(job: QueuedJob, now: float) -> tuple[str, ...]:
        """As `state.read_state` builds `QueuedJob.pools`: the job's ask with its nodes and its spot
        preemptions so far, its runtime the work its checkpoint leaves."""
        ask = replace(asks[job.job_id], spot_preemptions=spot_preempted[job.job_id],
                      waiting_since=last_ended[job.job_id])
        remaining = work_left(jobs[job.job_id])
        if ask.capacity == "auto" and SPOT_POOL in pools and job.job_id not in kept_off \
                and ask.spot_preemptions >= preemption_allowance(remaining, pools[SPOT_POOL], rules, ask.nodes):
            kept_off[job.job_id] = now
        return allowed_pools(ask, remaining, pool_list, now, rules)

    started_wall = time.perf_counter()
    limit = args.days * DAY + 60 * DAY  # arrivals stop at --days; every job is then run to its end
    now = 0.0
    while events and finished < len(jobs):
        now = events[0][0]
        if now > limit:
            break
        while events and events[0][0] == now:
            _, kind, _, key, number = heapq.heappop(events)
            attempt = running.get(key)
            if kind == P_ARRIVAL:
                enqueue(jobs[key], now)
            elif kind == P_END and attempt is not None and attempt.number == number and attempt.stop_at is None:
                finish_attempt(attempt, now)
                attempt.job.finished_at = now
                finished += 1
            elif kind == P_EXIT and attempt is not None and attempt.number == number:
                finish_attempt(attempt, now)
                attempt.job.checkpoint_at = now if attempt.checkpointed else \
                    attempt.last_checkpoint(attempt.stop_at, every)
                enqueue(attempt.job, now)
            elif kind == P_RECLAIM and number == generation[key]:
                reclaim(key, now, args.replace_s)
            elif kind == P_DROUGHT:
                up = [n.name for n in nodes if n.pool == SPOT_POOL and n.name not in draining and n.name not in gone]
                count = min(len(up), round(args.drought_share * scenario.spot_nodes))
                droughts += 1
                for name in drought_pick.sample(up, count):
                    reclaim(name, now, args.drought_hours * HOUR)
                next_drought(now)
            elif kind == P_GONE:
                draining.discard(key)
                gone.add(key)
                push(now + away[key], P_BACK, key)
            elif kind == P_BACK:
                gone.discard(key)
                gone_s += max(0.0, min(now, args.days * DAY) - (now - away[key]))  # inside the days of arrivals
                next_reclaim(key, now)
            elif kind == P_TICK:
                push(now + args.tick_s, P_TICK)
        if finished >= len(jobs):
            break
        # what `read_state` finds: auto jobs on spot whose deadline is at risk there, on the work they
        # have left (`_deadline_at_risk` asks with no spot preemptions)
        moving = [a for a in running.values() if a.stop_at is None and pools[a.pool].kind == SPOT
                  and at_risk(asks[a.job.trace.job_id], work_left(a.job, a.trained(now)), pools[a.pool], now, rules)]
        decision = None
        if queue:
            for job in list(queue.values()):
                wanted = allowed(job, now)
                if wanted != job.pools:
                    queue[job.job_id] = replace(job, pools=wanted)
                    index.add(queue[job.job_id])
            # the inventory: terminated nodes are not in it, draining ones take nothing new
            inventory = nodes if not (draining or gone) else \
                [Node(n.name, n.total, set() if n.name in draining else n.free, n.pool)
                 for n in nodes if n.name not in gone]
            stopping = {job_id for job_id, a in running.items() if a.stop_at is not None}
            holds = {job_id: h for job_id, h in holds.items() if job_id in queue and h.until > now}
            decision = decide(index, inventory, views_now(now), now, config, usage.at(now, list(running.values())),
                              stopping=stopping, holds=holds)
            policy_calls += 1
            for job, assignment in decision.starts:
                holds.pop(job.job_id, None)
                start(job.job_id, assignment, now)
        for attempt in moving:  # `_move_off_spot`: checkpoint, requeue
            if attempt.stop_at is None:
                stop(attempt, now, "move")
        if decision is not None:
            for hold in decision.holds(now, config):
                holds[hold.job_id] = hold
            for _for_job, victims, _landing in decision.preemptions:
                for victim in victims:
                    attempt = running[victim.job_id]
                    if attempt.stop_at is None:
                        stop(attempt, now, "tier")
    end = now
    wall = time.perf_counter() - started_wall

    for attempt in list(running.values()):  # only when the run hit its limit
        finish_attempt(attempt, end)
    spot_gpu_h = sum(s for pool, s in gpu_s.items() if pools[pool].kind == SPOT) / HOUR
    cost = sum(s / HOUR * pools[pool].price_per_gpu_hour for pool, s in gpu_s.items())
    # a fixed cluster pays for its nodes whether busy or not: over the days of arrivals, less the
    # time reclaimed spot nodes were away
    window = args.days * DAY
    inventory_cost = sum(NODE_GPUS * pools[node.pool].price_per_gpu_hour * window for node in nodes) / HOUR \
        - NODE_GPUS * args.spot_price * gone_s / HOUR
    missed = [s for s in jobs.values() if s.finished_at is None or s.finished_at > deadlines[s.trace.job_id]]
    waits = [(s.first_start if s.first_start is not None else end) - s.trace.arrival for s in jobs.values()]
    premium = [(s.first_start if s.first_start is not None else end) - s.trace.arrival for s in jobs.values()
               if s.trace.tier == "premium"]
    full_ft = [(s.first_start if s.first_start is not None else end) - s.trace.arrival for s in jobs.values()
               if s.trace.gpus_per_node]
    late = [s.finished_at - deadlines[s.trace.job_id] for s in missed if s.finished_at is not None]

    def queued(state: JobState) -> float:
        return state.queued_total + (end - state.enqueued_at if state.trace.job_id in queue else 0.0)

    def most_preempted(state: JobState) -> str:
        t = state.trace
        causes = ", ".join(f"{n} {cause}" for cause, n in stopped_by[t.job_id].most_common())
        return (f"{t.job_id} {t.tier} {t.cls}, {t.work_s / HOUR:.1f} h of work (estimate "
                f"{t.estimate_s / t.work_s:.2f}x), deadline +{(deadlines[t.job_id] - t.arrival) / HOUR:.1f} h: "
                f"preempted {state.preemptions}x ({causes or 'never'}), {outcome(state)}")

    def outcome(state: JobState) -> str:
        if state.finished_at is None:
            return f"not finished after {(end - state.trace.arrival) / HOUR:.1f} h"
        return f"finished +{(state.finished_at - state.trace.arrival) / HOUR:.1f} h"
    return {
        "name": scenario.name, "rate": rate, "spot_nodes": scenario.spot_nodes,
        "on_demand_nodes": args.nodes - scenario.spot_nodes,
        "gpu_h": sum(gpu_s.values()) / HOUR, "spot_gpu_h": spot_gpu_h, "cost": cost,
        "inventory_cost": inventory_cost, "lost_gpu_h": {cause: s / HOUR for cause, s in lost_s.items()},
        "stops": stops, "reclaims": reclaims, "reclaims_hitting": reclaims_hitting, "droughts": droughts,
        "max_preemptions_one_job": max(s.preemptions for s in jobs.values()),
        "most_preempted": most_preempted(max(jobs.values(), key=lambda s: (s.preemptions, s.trace.job_id))),
        "misses": len(missed), "jobs": len(jobs), "late_max": max(late, default=0.0),
        "missed_classes": {c.name: sum(1 for s in missed if s.trace.cls == c.name) for c in CLASSES},
        "missed_detail": [
            f"{s.trace.job_id} {s.trace.tier} {s.trace.cls}: arrived day {s.trace.arrival / DAY:.2f}, "
            f"{s.trace.work_s / HOUR:.1f} h of work (estimate {s.trace.estimate_s / s.trace.work_s:.2f}x), "
            f"deadline +{(deadlines[s.trace.job_id] - s.trace.arrival) / HOUR:.1f} h, "
            f"{outcome(s)}; preempted {s.preemptions}x "
            f"({spot_preempted[s.trace.job_id]} reclaimed on spot), queued {duration(queued(s))} in all; "
            f"ran on {', '.join(ran_on[s.trace.job_id]) or 'nothing'}"
            for s in sorted(missed, key=lambda s: s.trace.arrival)],
        "waits": waits, "premium_waits": premium, "full_ft_waits": full_ft, "finished": finished, "end": end,
        "max_queued": max(queued(s) for s in jobs.values()),
        "max_spot_preemptions_one_job": max(spot_preempted.values()),
        "left_spot": len(kept_off), "back_on_spot": len(returned),
        "back_on_spot_after": sorted(returned.values()),  # (wait since it was last queued, deadline lost)
        "moved_jobs": len(moved_off), "moved_more_than_once": sum(1 for n in moved_off.values() if n > 1),
        "max_moves_one_job": max(moved_off.values(), default=0),
        "left_spot_classes": {c.name: sum(1 for job_id in kept_off if jobs[job_id].trace.cls == c.name)
                              for c in CLASSES},
        "full_ft_spot_share": sum(v for pool, v in full_ft_s.items() if pools[pool].kind == SPOT)
        / sum(full_ft_s.values()) if sum(full_ft_s.values()) else None,
        "policy_calls": policy_calls, "wall_s": wall,
    }


def run_pools(args: argparse.Namespace, trace: Sequence[TraceJob] | None = None,
              rate: float | None = None, names: Sequence[str] | None = None) -> list[dict]:
    """The scenarios (all, or those named) on one trace: the figures of each."""
    trace = build_trace(args) if trace is None else trace
    rate = args.spot_reclaims_per_node_hour if rate is None else rate
    deadlines = draw_deadlines(trace, args)
    config = PolicyConfig(aging_s=args.aging_s)
    return [simulate_pools(scenario, trace, deadlines, args, config, rate)
            for scenario in scenarios(args) if names is None or scenario.name in names]


def share(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def saving(result: dict, baseline: dict) -> float:
    return 1.0 - result["cost"] / baseline["cost"]


def print_pool_results(results: list[dict]) -> None:
    baseline = results[0]
    width = 18
    print(f"{'':40}" + "".join(f"{r['name']:>{width}}" for r in results))

    def row(label: str, values: list[str]) -> None:
        print(f"{label:40}" + "".join(f"{value:>{width}}" for value in values))

    row("nodes: spot / on-demand", [f"{r['spot_nodes']} / {r['on_demand_nodes']}" for r in results])
    row("GPU-hours billed (attempts)", [f"{r['gpu_h']:,.0f}" for r in results])
    row("  on spot", [f"{r['spot_gpu_h'] / r['gpu_h']:.1%}" for r in results])
    row("cost ($, GPU-hours x pool price)", [f"{r['cost']:,.0f}" for r in results])
    row("  saving vs on-demand only", [f"{saving(r, baseline):.1%}" for r in results])
    row("  full fine-tunes' GPU-hours on spot", [share(r["full_ft_spot_share"]) for r in results])
    row("fixed cluster: all nodes, --days ($)", [f"{r['inventory_cost']:,.0f}" for r in results])
    row("  saving vs on-demand only",
        [f"{1 - r['inventory_cost'] / baseline['inventory_cost']:.1%}" for r in results])
    row("deadline misses", [f"{r['misses']} ({r['misses'] / r['jobs']:.2%})" for r in results])
    row("  latest finish past a deadline", [duration(r["late_max"]) if r["misses"] else "-" for r in results])
    for cls in CLASSES:
        row(f"  misses, {cls.name}", [str(r["missed_classes"][cls.name]) for r in results])
    row("spot reclaims (nodes)", [str(r["reclaims"]) for r in results])
    if any(r["droughts"] for r in results):
        row("  droughts", [str(r["droughts"]) for r in results])
    row("  hitting running attempts", [str(r["reclaims_hitting"]) for r in results])
    row("preempted attempts: reclaimed", [str(r["stops"]["reclaim"]) for r in results])
    row("  moved off spot (at_risk)", [str(r["stops"]["move"]) for r in results])
    row("    jobs moved / more than once", [f"{r['moved_jobs']} / {r['moved_more_than_once']}" for r in results])
    row("    most moves of one job", [str(r["max_moves_one_job"]) for r in results])
    row("  for a premium job (tier)", [str(r["stops"]["tier"]) for r in results])
    row("  most of one job", [str(r["max_preemptions_one_job"]) for r in results])
    row("  most reclaims of one job", [str(r["max_spot_preemptions_one_job"]) for r in results])
    row("auto jobs kept off spot (allowance)", [str(r["left_spot"]) for r in results])
    row("  back on spot (deadline lost, long wait)", [str(r["back_on_spot"]) for r in results])
    row("    after waiting, shortest", [duration(r["back_on_spot_after"][0][0]) if r["back_on_spot_after"] else "-"
                                         for r in results])
    row("    after waiting, longest", [duration(r["back_on_spot_after"][-1][0]) if r["back_on_spot_after"] else "-"
                                        for r in results])
    row("    of them past hope of their deadline", [str(sum(lost for _, lost in r["back_on_spot_after"]))
                                                   for r in results])
    row("GPU-hours lost to reclaims", [f"{r['lost_gpu_h']['reclaim']:.1f}" for r in results])
    row("GPU-hours lost to moves off spot", [f"{r['lost_gpu_h']['move']:.1f}" for r in results])
    row("GPU-hours lost, all preemptions", [f"{sum(r['lost_gpu_h'].values()):.1f}" for r in results])
    row("wait p50 / p95 (all jobs)",
        [f"{duration(pct(r['waits'], 50))} / {duration(pct(r['waits'], 95))}" for r in results])
    row("wait max", [duration(max(r["waits"])) for r in results])
    row("wait p95 premium", [duration(pct(r["premium_waits"], 95)) if r["premium_waits"] else "-" for r in results])
    row("wait p50 / max, full fine-tunes",
        [f"{duration(pct(r['full_ft_waits'], 50))} / {duration(max(r['full_ft_waits']))}" if r["full_ft_waits"]
         else "-" for r in results])
    row("longest time queued (requeues incl.)", [duration(r["max_queued"]) for r in results])
    row("jobs finished", [f"{r['finished']} / {r['jobs']}" for r in results])
    row("last job finished at", [f"day {r['end'] / DAY:.2f}" for r in results])
    row("policy calls", [str(r["policy_calls"]) for r in results])
    row("simulated in (wall s)", [f"{r['wall_s']:.1f}" for r in results])


def pools_main(args: argparse.Namespace) -> None:
    began = time.perf_counter()
    print(f"machine: {machine()}")
    sources = [Path(policy.__file__).with_name(name)
               for name in ("policy.py", "ordering.py", "policy_inputs.py", "pools.py")]
    digest = hashlib.sha256(b"".join(source.read_bytes() for source in sources)).hexdigest()[:12]
    print(f"policy: {', '.join(source.name for source in sources)} in {sources[0].parent} (sha256 {digest})")
    trace = build_trace(args)
    print(f"trace: seed {args.seed}, {args.days:g} days, {len(trace)} jobs, "
          f"{sum(t.gpus * t.work_s for t in trace) / HOUR:,.0f} GPU-hours of work; deadlines: arrival + "
          f"U({args.deadline_slack}) x true runtime + {duration(args.deadline_allowance_s)}")
    print(f"cluster: {args.nodes} nodes x {NODE_GPUS} GPUs; auto: {args.spot_share:.0%} spot; prices per GPU-hour: "
          f"on-demand ${args.on_demand_price:.2f}, spot ${args.spot_price:.2f} "
          f"({1 - args.spot_price / args.on_demand_price:.0%} off)")
    print(f"spot: {args.spot_reclaims_per_node_hour:g} reclaims per node-hour (Poisson, per node), "
          f"{args.reclaim_notice_s:g} s notice, back {duration(args.replace_s)} after termination; "
          f"preemption: {args.stop_s:g} s to checkpoint and exit + {args.restore_s:g} s to restore; "
          f"periodic checkpoints every {duration(args.checkpoint_every_s)}; rules: "
          f"{SpotRules(args.spot_max_preemptions, args.spot_max_wait_s)}")
    if args.spot_droughts_per_week:
        print(f"droughts: {args.spot_droughts_per_week:g} a week (Poisson), each reclaiming {args.drought_share:.0%} "
              f"of the spot nodes at once for {args.drought_hours:g} h")
    print()
    results = run_pools(args, trace)
    print_pool_results(results)
    baseline, spot_only, auto = results
    for r in results[1:]:
        if r["max_preemptions_one_job"]:
            print(f"{r['name']}, most preempted: {r['most_preempted']}")
        if r["missed_detail"]:
            print(f"{r['name']}, deadlines missed:")
            for line in r["missed_detail"][:8]:
                print(f"  {line}")
            if len(r["missed_detail"]) > 8:
                print(f"  ... and {len(r['missed_detail']) - 8} more")
    print()
    print("auto's saving at other spot discounts (same run; the placement does not depend on the price):")
    spot_h, steady_h = auto["spot_gpu_h"], auto["gpu_h"] - auto["spot_gpu_h"]
    print("  " + ", ".join(f"{d:.0%} off: {1 - (spot_h * (1 - d) + steady_h) / baseline['gpu_h']:.1%}"
                           for d in (0.5, 0.6, 0.7, 0.8)))
    print()
    print("goals (from the issue):")
    print(f"  auto costs >= 40% less than on-demand only: {saving(auto, baseline):.1%} -> "
          f"{met(saving(auto, baseline) >= 0.4)}")
    print(f"  auto misses <= 1% of the deadlines: {auto['misses']} of {auto['jobs']} "
          f"({auto['misses'] / auto['jobs']:.2%}) -> {met(auto['misses'] <= 0.01 * auto['jobs'])}")
    print(f"  deadline misses: spot only, no fallback {spot_only['misses']} "
          f"({spot_only['misses'] / spot_only['jobs']:.2%}); auto {auto['misses']}; "
          f"on-demand only {baseline['misses']}")
    rates = [float(v) for v in args.sweep_reclaims.split(",") if v.strip()]
    if rates:
        print()
        print("reclaim rate sweep (spot only and auto; on-demand only does not depend on it):")
        head = ["reclaims/node-h", "auto saving", "auto misses", "auto reclaimed", "auto moved", "auto kept off",
                "auto on spot", "auto lost GPU-h", "spot saving", "spot misses", "spot lost GPU-h"]
        print("  " + "".join(f"{h:>17}" for h in head))
        for rate in rates:
            spot_r, auto_r = run_pools(args, trace, rate, ("spot only", "auto"))
            cells = [f"{rate:g}", f"{saving(auto_r, baseline):.1%}",
                     f"{auto_r['misses']} ({auto_r['misses'] / auto_r['jobs']:.1%})", str(auto_r["stops"]["reclaim"]),
                     str(auto_r["stops"]["move"]), str(auto_r["left_spot"]),
                     f"{auto_r['spot_gpu_h'] / auto_r['gpu_h']:.1%}",
                     f"{auto_r['lost_gpu_h']['reclaim']:.1f}", f"{saving(spot_r, baseline):.1%}",
                     f"{spot_r['misses']} ({spot_r['misses'] / spot_r['jobs']:.1%})",
                     f"{spot_r['lost_gpu_h']['reclaim']:.1f}"]
            print("  " + "".join(f"{c:>17}" for c in cells))
    caps = [int(v) for v in args.sweep_max_preemptions.split(",") if v.strip()]
    if caps:
        print()
        print(f"auto with other TUNEFORGE_SPOT_MAX_PREEMPTIONS (reclaims {args.spot_reclaims_per_node_hour:g} "
              "per node-hour; spot only and on-demand only do not depend on it):")
        head = ["max preemptions", "saving", "misses", "on spot", "full-ft on spot", "kept off spot",
                "longest queued", "last job done"]
        print("  " + "".join(f"{h:>17}" for h in head))
        for cap in caps:
            variant = argparse.Namespace(**{**vars(args), "spot_max_preemptions": cap})
            (auto_c,) = run_pools(variant, trace, names=("auto",))
            cells = [str(cap), f"{saving(auto_c, baseline):.1%}",
                     f"{auto_c['misses']} ({auto_c['misses'] / auto_c['jobs']:.2%})",
                     f"{auto_c['spot_gpu_h'] / auto_c['gpu_h']:.1%}", share(auto_c["full_ft_spot_share"]),
                     str(auto_c["left_spot"]), duration(auto_c["max_queued"]), f"day {auto_c['end'] / DAY:.2f}"]
            print("  " + "".join(f"{c:>17}" for c in cells))
    print()
    print(f"run time: {time.perf_counter() - began:.0f} s wall")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--seed", type=int, default=None, help="the trace's seed (default 0; 2 with --pools)")
    parser.add_argument("--nodes", type=int, default=41, help="8-GPU nodes")
    parser.add_argument("--jobs-per-day", type=float, default=500.0)
    parser.add_argument("--burst-factor", type=float, default=4.0)
    parser.add_argument("--burst-hour", type=int, default=14)
    parser.add_argument("--runtime-sigma", type=float, default=0.5)
    parser.add_argument("--estimate-sigma", type=float, default=0.3)
    parser.add_argument("--tick-s", type=float, default=60.0)
    parser.add_argument("--stop-s", type=float, default=30.0, help="SIGTERM to exit: checkpoint (GPUs held)")
    parser.add_argument("--restore-s", type=float, default=90.0, help="restart: load the model and the checkpoint")
    parser.add_argument("--checkpoint-every-s", type=float, default=1800.0)
    parser.add_argument("--policies", default="fifo,strict,tuneforge")
    parser.add_argument("--aging-s", type=float, default=PolicyConfig().aging_s,
                        help="queue aging: waiting this long is worth one tier (TUNEFORGE_SCHEDULER_AGING_S)")
    parser.add_argument("--queue-size", type=int, default=10_000)
    parser.add_argument("--ticks", type=int, default=50)
    parser.add_argument("--profile", action="store_true", help="profile the decision ticks even if the goal is met")
    pools = parser.add_argument_group("capacity pools (--pools)")
    pools.add_argument("--pools", action="store_true",
                       help="on-demand only, spot only and auto on one trace, with spot reclaims")
    pools.add_argument("--spot-share", type=float, default=0.75, help="auto: share of the nodes that are spot")
    pools.add_argument("--on-demand-price", type=float, default=ON_DEMAND_PRICE, help="per GPU-hour")
    pools.add_argument("--spot-price", type=float, default=SPOT_PRICE, help="per GPU-hour")
    pools.add_argument("--spot-reclaims-per-node-hour", type=float, default=RECLAIMS_PER_NODE_HOUR,
                       help="reclaims of each spot node, a Poisson process (also the pool's preemptions_per_hour)")
    pools.add_argument("--reclaim-notice-s", type=float, default=120.0,
                       help="reclaim notice to termination; shorter than --stop-s: the trainer is killed before "
                            "its checkpoint and loses the training since its last periodic one")
    pools.add_argument("--replace-s", type=float, default=600.0,
                       help="a reclaimed node is back (replaced) this long after its termination")
    pools.add_argument("--deadline-slack", default="2,6",
                       help="deadline = arrival + U(lo, hi) x true runtime + --deadline-allowance-s")
    pools.add_argument("--deadline-allowance-s", type=float, default=3600.0)
    pools.add_argument("--spot-droughts-per-week", type=float, default=0.0,
                       help="correlated reclaims: a Poisson process taking --drought-share of the spot nodes at "
                            "once, away for --drought-hours (illustrative, not from public figures)")
    pools.add_argument("--drought-share", type=float, default=0.5)
    pools.add_argument("--drought-hours", type=float, default=6.0)
    pools.add_argument("--spot-max-preemptions", type=int, default=2, help="TUNEFORGE_SPOT_MAX_PREEMPTIONS")
    pools.add_argument("--spot-max-wait-s", type=float, default=1800.0, help="TUNEFORGE_SPOT_MAX_WAIT_S")
    pools.add_argument("--sweep-reclaims", default="",
                       help="also run spot only and auto at these reclaim rates (comma-separated)")
    pools.add_argument("--sweep-max-preemptions", default="",
                       help="also run auto with these --spot-max-preemptions (comma-separated)")
    hardware_module().add_arguments(parser)
    return parser


def hardware_module() -> ModuleType:
    """`scheduler_sim_hardware`, beside this file (importable however this file was loaded)."""
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    import scheduler_sim_hardware

    return scheduler_sim_hardware


def main() -> None:
    args = build_parser().parse_args()
    if args.hardware:
        args.seed = 0 if args.seed is None else args.seed
        hardware_module().hardware_main(args, machine())
        return
    if args.pools:
        if args.seed is None:
            args.seed = 2
        pools_main(args)
        return
    if args.seed is None:
        args.seed = 0
    config = PolicyConfig(aging_s=args.aging_s)

    print(f"machine: {machine()}")
    # the policy's code: policy.py with the queue order and inputs it imports
    sources = [Path(policy.__file__).with_name(name) for name in ("policy.py", "ordering.py", "policy_inputs.py")]
    digest = hashlib.sha256(b"".join(source.read_bytes() for source in sources)).hexdigest()[:12]
    print(f"policy: {', '.join(source.name for source in sources)} in {sources[0].parent} (sha256 {digest})")
    trace = build_trace(args)
    per_class = {c.name: sum(1 for t in trace if t.cls == c.name) for c in CLASSES}
    per_tier = {tier: sum(1 for t in trace if t.tier == tier) for tier in TIERS}
    print(f"trace: seed {args.seed}, {args.days:g} days, {len(trace)} jobs ({len(trace) / args.days:.0f}/day), "
          f"burst {args.burst_factor:g}x at {args.burst_hour:02d}:00; classes {per_class}; tiers {per_tier}")
    print(f"cluster: {args.nodes} nodes x {NODE_GPUS} GPUs = {args.nodes * NODE_GPUS} GPUs; tick {args.tick_s:g} s; "
          f"preemption: {args.stop_s:g} s to checkpoint and exit + {args.restore_s:g} s to restore; "
          f"checkpoints every {args.checkpoint_every_s:g} s")
    print(f"policy config: aging {config.aging_s:g} s per tier, fair share {config.fair_share_s_per_gpu_hour:g} "
          f"s per GPU-hour (max {config.fair_share_max_s:g} s), targets {config.target_wait_s}, "
          f"backfill depth {config.backfill_depth}, overrun {config.overrun_fraction:g} of the estimate "
          f"(min {config.min_overrun_s:g} s), holds {config.hold_s:g} s, {config.preemptors_per_tick} preemptors "
          f"per decision")
    print()
    results = [simulate(name, trace, args, config) for name in args.policies.split(",")]
    print_results(results)

    print()
    print(f"decision time: {args.queue_size} queued jobs, a full cluster, {args.ticks} ticks")
    bench = decision_bench(args, config)
    setup = bench["setup"]
    print(f"  start: {setup['running']} running jobs on {setup['busy_gpus']} busy GPUs, {setup['queued']} queued "
          f"({setup['overdue']} already past their tier's target wait); over the ticks {bench['started']} "
          f"started, {bench['preempted']} preempted")
    print(f"  {'ms per tick':24}{'p50':>10}{'p95':>10}{'max':>10}")
    for part in PARTS:
        values = bench["timings"][part]
        print(f"  {part:24}" + "".join(f"{v * 1e3:>10.2f}" for v in (pct(values, 50), pct(values, 95), max(values))))
    decision_p50 = pct(bench["timings"]["decide"], 50)
    decision_p95 = pct(bench["timings"]["decide"], 95)

    print()
    print("goals (from the issue):")
    print(f"  {'':44}" + "".join(f"{r['name']:>22}" for r in results))
    premium = [pct(r["waits"]["premium"], 95) if r["waits"]["premium"] else None for r in results]
    print(f"  {'premium p95 wait < 5 min':44}"
          + "".join(f"{'no premium jobs' if v is None else f'{duration(v)} {met(v < 300)}':>22}" for v in premium))
    ratios = [r["useful_utilization"] / r["offered"] for r in results]
    print(f"  {'useful utilization >= 90% of offered load':44}"
          + "".join(f"{f'{v:.1%} {met(v >= 0.9)}':>22}" for v in ratios))
    longest = [max(max((max(w) for w in r["waits"].values() if w), default=0.0), r["max_queued"][0])
               for r in results]
    print(f"  {'no job waits (queued) over 24 h':44}"
          + "".join(f"{f'{duration(v)} {met(v <= DAY)}':>22}" for v in longest))
    goal_ok = decision_p95 < 0.010
    print(f"  tuneforge decision < 10 ms per tick at {args.queue_size} queued jobs: p50 {decision_p50 * 1e3:.1f} ms, "
          f"p95 {decision_p95 * 1e3:.1f} ms -> {met(goal_ok)} (judged on the p95)")
    if not goal_ok or args.profile:
        print()
        print(f"where the decision time goes (cProfile over the same {args.ticks} ticks, by own time):")
        profiler = cProfile.Profile()
        decision_bench(args, config, profiler)
        out = io.StringIO()
        stats = pstats.Stats(profiler, stream=out)
        stats.sort_stats("tottime").print_stats(14)
        print_stats_table(out.getvalue())
        print("the policy's functions, by cumulative time:")
        out = io.StringIO()
        stats.stream = out
        stats.sort_stats("cumulative").print_stats(r"scheduler[/\\]policy\.py", 10)
        print_stats_table(out.getvalue())


def print_stats_table(text: str) -> None:
    lines = text.splitlines()
    start_at = next((i for i, line in enumerate(lines) if "ncalls" in line), 0)
    for line in lines[start_at:]:
        if line.strip():
            print("  " + line.replace(str(Path.cwd()) + "/", ""))


if __name__ == "__main__":
    main()
