"""Placement by GPU hardware in simulated time (`benchmarks/scheduler_sim.py --hardware`).

    python benchmarks/scheduler_sim.py --hardware [--seed 0] [--days 3] [--load 0.85]
        [--hw-nodes "NVIDIA A100-SXM4-40GB:39.4:8,NVIDIA A100-SXM4-80GB:79.2:6,NVIDIA H100 80GB HBM3:79.6:4"]

A heterogeneous cluster of 8-GPU nodes (default: 8 nodes of A100 40 GB, 6 of A100 80 GB, 4 of
H100 80 GB; 144 GPUs, memory as NVML reports it) and one seeded trace: Poisson arrivals at
`--load` times what the cluster can run; jobs need 70 GB per GPU (20%), 35 GB (30%), any GPU
(45%: 16 GB) or ask for `h100` by type (5%); 1 GPU (60%), 2 (25%), 4 (10%) or 8 (5%), all on one
node; true runtimes lognormal around 1 h (sigma 0.5), the policy told an estimate off by a
lognormal factor (sigma 0.3). Tiers and tenants as the main simulation draws them.

Two rules on the same trace, both `policy.decide` at every event time (arrivals and ends; no
preemption targets, so every tier waits its turn):

- hardware: each `QueuedJob.hardware` is the job's ask (`planning.hardware.GpuAsk`) and each node
  reports its GPU model and memory, as `services/training/cluster_state.py` builds them.
- count only: the rule before nodes reported hardware: GPU counts only. A job placed on GPUs of
  the wrong type or with too little memory fails at its first step (out of memory,
  `--oom-s` after its start) and is requeued as a platform failure; after `--max-failures` it fails.

Figures: utilization (busy GPU-hours over the cluster's), useful utilization (only the work of
jobs on the right hardware), waits from arrival to the start that ran on the right GPUs (p50,
p95, max) per need, placements on wrong hardware, failed jobs, jobs finished. The hardware rule
must place nothing on wrong hardware.
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from tuneforge.planning.hardware import GpuAsk
from tuneforge.planning.policy import Node, PolicyConfig, QueuedJob, RunningJob, decide

HOUR = 3600.0
DAY = 86400.0
NODE_GPUS = 8
DEFAULT_NODES = "NVIDIA A100-SXM4-40GB:39.4:8,NVIDIA A100-SXM4-80GB:79.2:6,NVIDIA H100 80GB HBM3:79.6:4"
NEEDS = (("70 GB", 0.20, "", 70.0), ("35 GB", 0.30, "", 35.0), ("any", 0.45, "", 16.0), ("h100", 0.05, "h100", 16.0))
GPU_COUNTS = ((1, 0.60), (2, 0.25), (4, 0.10), (8, 0.05))
TIERS = (("premium", 0.25), ("standard", 0.60), ("free", 0.15))
MEAN_RUNTIME_S = HOUR


@dataclass(frozen=True)
class HwJob:
    job_id: str
    tenant: str
    tier: str
    need: str  # the class of its need, for the figures
    ask: GpuAsk
    gpus: int
    arrival: float
    work_s: float
    estimate_s: float


def parse_nodes(spec: str) -> list[Node]:
    nodes: list[Node] = []
    for part in spec.split(","):
        model, memory, count = part.rsplit(":", 2)
        for _ in range(int(count)):
            nodes.append(Node(f"n{len(nodes):02d}", NODE_GPUS, set(range(NODE_GPUS)), gpu_model=model,
                              gpu_memory_gb=float(memory)))
    return nodes


def build_trace(args: argparse.Namespace, total_gpus: int) -> list[HwJob]:
    rng = random.Random(args.seed)
    mean_gpus = sum(count * share for count, share in GPU_COUNTS)
    rate = args.load * total_gpus / (mean_gpus * MEAN_RUNTIME_S)  # jobs per second
    jobs, now, sigma = [], 0.0, 0.5
    while True:
        now += rng.expovariate(rate)
        if now >= args.days * DAY:
            return jobs
        need, _share, gpu_type, memory = rng.choices(NEEDS, weights=[n[1] for n in NEEDS])[0]
        gpus = rng.choices([c for c, _ in GPU_COUNTS], weights=[s for _, s in GPU_COUNTS])[0]
        tier = rng.choices([t for t, _ in TIERS], weights=[s for _, s in TIERS])[0]
        work = rng.lognormvariate(math.log(MEAN_RUNTIME_S) - sigma * sigma / 2, sigma)
        jobs.append(HwJob(f"h{len(jobs):06d}", f"{tier[0]}{rng.randint(1, 4)}", tier, need,
                          GpuAsk.parse(gpu_type, memory), gpus, now, work,
                          work * rng.lognormvariate(0.0, 0.3)))


@dataclass
class Run:
    job: HwJob
    queued_at: float
    failures: int = 0
    started: float | None = None  # the start that ran on the right GPUs
    finished: float | None = None
    failed: bool = False
    wrong: list[str] = field(default_factory=list)


def simulate(rule: str, trace: Sequence[HwJob], nodes: Sequence[Node], args: argparse.Namespace) -> dict:
    """One rule on the trace; see the module docstring."""
    config = PolicyConfig(target_wait_s={"premium": None, "standard": None, "free": None})
    by_name = {node.name: node for node in nodes}
    for node in nodes:
        node.free = set(range(node.total))
    runs = {job.job_id: Run(job, job.arrival) for job in trace}
    events: list[tuple[float, int, str, str]] = [(job.arrival, i, "arrive", job.job_id) for i, job in enumerate(trace)]
    heapq.heapify(events)
    seq = len(events)
    queued: dict[str, QueuedJob] = {}
    running: dict[str, tuple[RunningJob, bool]] = {}  # job -> (as the policy sees it, on the right hardware)
    busy_s = useful_s = 0.0
    horizon = args.days * DAY
    wrong_placements = 0
    while events:
        now = events[0][0]
        while events and events[0][0] == now:
            _t, _i, kind, job_id = heapq.heappop(events)
            run = runs[job_id]
            if kind == "arrive":
                queued[job_id] = _queued(run, rule)
                continue
            held, right = running.pop(job_id)
            for name, ids in held.placement.items():
                by_name[name].free.update(ids)
            spent = (min(now, horizon) - min(held.started_at, horizon)) * held.gpus
            busy_s += spent
            if right:
                useful_s += spent
                run.finished = now
            else:
                run.failures += 1
                if run.failures >= args.max_failures:
                    run.failed = True
                else:
                    run.queued_at = now
                    queued[job_id] = _queued(run, rule)
        if not queued:
            continue
        decision = decide(list(queued.values()), nodes, [r for r, _ in running.values()], now, config)
        for job, assignment in decision.starts:
            run = runs[job.job_id]
            del queued[job.job_id]
            right = all(run.job.ask.fits(by_name[name].gpu_model, by_name[name].gpu_memory_gb)
                        for name in assignment)
            for name, ids in assignment.items():
                by_name[name].free.difference_update(ids)
            if right:
                run.started = now
                end = now + run.job.work_s
            else:
                wrong_placements += 1
                run.wrong.append(",".join(by_name[name].gpu_model for name in assignment))
                end = now + args.oom_s
            running[job.job_id] = (RunningJob(job.job_id, job.tenant_id, job.tier, assignment, now,
                                              now + run.job.estimate_s, now), right)
            seq += 1
            heapq.heappush(events, (end, seq, "end", job.job_id))
    capacity_s = sum(node.total for node in nodes) * horizon
    return {"rule": rule, "utilization": busy_s / capacity_s, "useful": useful_s / capacity_s,
            "wrong": wrong_placements, "runs": list(runs.values()),
            "failed": sum(1 for run in runs.values() if run.failed),
            "finished": sum(1 for run in runs.values() if run.finished is not None and not run.failed)}


def _queued(run: Run, rule: str) -> QueuedJob:
    job = run.job
    return QueuedJob(job.job_id, job.tenant, job.tier, job.gpus, run.queued_at, job.estimate_s,
                     seq=int(job.job_id[1:]), hardware=job.ask if rule == "hardware" else GpuAsk())


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)] if ordered else float("nan")


def minutes(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds / 60:.1f} min"


def waits(result: dict, need: str | None, end: float) -> list[float]:
    """Arrival to the start on the right hardware; a job never started there counts with its wait so far."""
    return [((run.started if run.started is not None else end) - run.job.arrival) for run in result["runs"]
            if need is None or run.job.need == need]


def print_results(results: list[dict], end: float) -> None:
    print(f"  {'':44}" + "".join(f"{r['rule']:>16}" for r in results))
    rows = [("GPU utilization", [f"{r['utilization']:.1%}" for r in results]),
            ("useful utilization (right hardware)", [f"{r['useful']:.1%}" for r in results]),
            ("placements on wrong hardware", [str(r["wrong"]) for r in results]),
            ("jobs failed (out of memory, 3 tries)", [str(r["failed"]) for r in results]),
            ("jobs finished", [str(r["finished"]) for r in results])]
    for need in (None, *(n[0] for n in NEEDS)):
        label = "all jobs" if need is None else f"needing {need}"
        for q in (50, 95):
            rows.append((f"wait p{q}, {label}", [minutes(pct(waits(r, need, end), q)) for r in results]))
    for label, values in rows:
        print(f"  {label:44}" + "".join(f"{v:>16}" for v in values))
    for result in results:
        wrong = Counter(model for run in result["runs"] for model in run.wrong)
        if wrong:
            print(f"  {result['rule']}: wrong placements by the GPUs they landed on: {dict(wrong)}")


def hardware_main(args: argparse.Namespace, machine: str) -> list[dict]:
    nodes = parse_nodes(args.hw_nodes)
    models = Counter(node.gpu_model for node in nodes)
    trace = build_trace(args, sum(node.total for node in nodes))
    print(f"machine: {machine}")
    print(f"cluster: {len(nodes)} nodes x {NODE_GPUS} GPUs: "
          + ", ".join(f"{count} x {model}" for model, count in models.items()))
    needs = Counter(job.need for job in trace)
    print(f"trace: seed {args.seed}, {args.days:g} days, load {args.load:g}, {len(trace)} jobs; needs {dict(needs)}")
    print()
    results = [simulate(rule, trace, nodes, args) for rule in ("hardware", "count only")]
    print_results(results, args.days * DAY)
    hardware = results[0]
    print()
    print(f"  hardware rule: placements on wrong hardware = {hardware['wrong']} "
          f"({'met' if hardware['wrong'] == 0 else 'NOT met'}: must be 0)")
    return results


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("placement by GPU hardware (--hardware)")
    group.add_argument("--hardware", action="store_true", help="heterogeneous GPUs: the hardware rule against "
                                                                 "GPU counts only (scheduler_sim_hardware.py)")
    group.add_argument("--hw-nodes", default=DEFAULT_NODES, help="model:GiB:nodes, comma-separated (8 GPUs each)")
    group.add_argument("--load", type=float, default=0.85, help="offered load as a share of the cluster")
    group.add_argument("--oom-s", type=float, default=120.0, help="count only: a misplaced job fails this late")
    group.add_argument("--max-failures", type=int, default=3, help="TUNEFORGE_MAX_ATTEMPT_FAILURES")
