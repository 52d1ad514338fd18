"""The scheduler simulator's capacity pools (`benchmarks/scheduler_sim.py --pools`), scaled down.

The seed-2 trace for one day on 8 nodes (100 jobs a day), half of them spot in the auto scenario,
spot reclaimed often (0.2 per node-hour) and in droughts (80% of the spot nodes at once, for 12 h),
the spot rules the defaults: the three scenarios run on the same trace with the scheduler's own
policy and pool functions. What must hold whatever the exact figures: auto pays less than on-demand
only and more than spot only, it misses no more deadlines than spot without a fallback, which here
does miss some, and on-demand capacity is never reclaimed.

Then a few jobs written out by hand, each checking one input the simulation gives the pool
functions as `services/training/cluster_state.py` does: the nodes a multi-node job spans (its expected spot
slowdown counts every one of them), the work a requeued job has left (not its whole estimate),
the work a running job has left by its progress (not by the clock), only reclaims as spot
preemptions (not the scheduler's own preemptions for premium jobs), and the time a job was last
queued (its last attempt's end) as where its wait counts from.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SIM = Path(__file__).resolve().parents[2] / "benchmarks" / "scheduler_sim.py"
ARGS = ["--pools", "--seed", "2", "--days", "1", "--nodes", "8", "--jobs-per-day", "100", "--spot-share", "0.5",
        "--spot-reclaims-per-node-hour", "0.2", "--spot-droughts-per-week", "14", "--drought-share", "0.8",
        "--drought-hours", "12"]


def load_sim() -> ModuleType:
    spec = importlib.util.spec_from_file_location("scheduler_sim", SIM)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while the file runs
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop(spec.name, None)
    return module


@pytest.fixture(scope="module")
def results() -> dict[str, dict]:
    sim = load_sim()
    args = sim.build_parser().parse_args(ARGS)
    return {result["name"]: result for result in sim.run_pools(args)}


def test_the_three_scenarios_share_the_trace_and_all_their_jobs_finish(results: dict[str, dict]) -> None:
    assert list(results) == ["on-demand only", "spot only", "auto"]
    jobs = {result["jobs"] for result in results.values()}
    assert len(jobs) == 1 and jobs.pop() > 50
    for result in results.values():
        assert result["finished"] == result["jobs"], result["name"]


def test_auto_costs_less_than_on_demand_only_and_more_than_spot_only(results: dict[str, dict]) -> None:
    on_demand, spot, auto = results["on-demand only"], results["spot only"], results["auto"]
    assert spot["cost"] < auto["cost"] < on_demand["cost"]
    assert 0.0 < auto["spot_gpu_h"] < auto["gpu_h"]  # auto ran on both pools
    assert spot["spot_gpu_h"] == pytest.approx(spot["gpu_h"]) and on_demand["spot_gpu_h"] == 0.0


def test_auto_misses_no_more_deadlines_than_spot_without_fallback(results: dict[str, dict]) -> None:
    spot, auto = results["spot only"], results["auto"]
    assert spot["reclaims_hitting"] > 0 and spot["lost_gpu_h"]["reclaim"] > 0
    assert spot["misses"] > 0, "the scenario no longer makes spot without a fallback miss: nothing is compared"
    assert auto["misses"] <= spot["misses"]


def test_on_demand_only_loses_no_work_to_reclaims(results: dict[str, dict]) -> None:
    on_demand = results["on-demand only"]
    assert on_demand["reclaims"] == 0 and on_demand["stops"]["reclaim"] == 0
    assert on_demand["lost_gpu_h"]["reclaim"] == 0.0
    assert on_demand["stops"]["move"] == 0


HOUR = 3600.0


def run_auto(argv: list[str], jobs: list[tuple], deadlines: list[float]) -> dict:
    """The auto scenario on jobs written out by hand: (id, tenant, tier, class, gpus, gpus per node,
    arrival, true runtime, estimate), each with its deadline."""
    sim = load_sim()
    args = sim.build_parser().parse_args(["--pools", "--seed", "2", "--days", "1", *argv])
    trace = [sim.TraceJob(*job) for job in jobs]
    (auto,) = [scenario for scenario in sim.scenarios(args) if scenario.name == "auto"]
    return sim.simulate_pools(auto, trace, {job[0]: deadline for job, deadline in zip(jobs, deadlines)}, args,
                              sim.PolicyConfig(aging_s=args.aging_s), args.spot_reclaims_per_node_hour)


def test_a_multi_node_job_counts_every_node_in_its_expected_spot_slowdown() -> None:
    # 4 spot nodes and 4 on-demand, 0.5 reclaims per node-hour; 10 h of work, 14.5 h to the deadline.
    # On one node spot is expected to take 10 x (1 + 0.5 x 420 s / 3600 s) = 10.6 h, 13.2 h with the
    # 1.25 margin: it fits. On four nodes, 12.3 h, 15.4 h with the margin: it does not.
    result = run_auto(["--nodes", "8", "--spot-share", "0.5", "--spot-reclaims-per-node-hour", "0.5"],
                      [("x", "s01", "standard", "full-ft", 32, 8, 0.0, 10 * HOUR, 10 * HOUR),
                       ("y", "s02", "standard", "small-lora", 1, 0, 0.0, 10 * HOUR, 10 * HOUR)],
                      [14.5 * HOUR, 14.5 * HOUR])
    assert result["finished"] == 2 and result["misses"] == 0
    assert result["full_ft_spot_share"] == 0.0  # the 4-node job ran on on-demand only
    assert result["spot_gpu_h"] > 0.0  # the 1-GPU job with the same deadline ran on spot


def test_preemptions_for_premium_jobs_neither_count_against_spot_nor_send_a_job_off_it() -> None:
    # Node n00 is spot, n01 on demand. A premium job holds 4 GPUs of n01 for 20 h (spot could not
    # meet its deadline); a standard job of 10 h (deadline 16 h) runs on the other 4 GPUs of n00.
    # Three 8-GPU premium jobs (deadlines far off: spot only) arrive at 1, 3 and 5 h; each can
    # only land on n00, so each preempts the standard job. Requeued, it has less and less work
    # left: spot still meets its deadline every time, so it waits for spot, though n01 has room
    # for it; once back on spot, its progress (not the attempt's start plus the whole estimate)
    # shows nothing at risk, so it is never moved. None of the three preemptions is a reclaim.
    result = run_auto(["--nodes", "2", "--spot-share", "0.5", "--spot-reclaims-per-node-hour", "0"],
                      [("f", "p02", "premium", "70b-lora", 4, 0, 0.0, 20 * HOUR, 20 * HOUR),
                       ("a", "s01", "standard", "70b-lora", 4, 0, 0.0, 10 * HOUR, 10 * HOUR),
                       ("p1", "p01", "premium", "small-lora", 8, 0, 1 * HOUR, 0.25 * HOUR, 0.25 * HOUR),
                       ("p2", "p01", "premium", "small-lora", 8, 0, 3 * HOUR, 0.25 * HOUR, 0.25 * HOUR),
                       ("p3", "p01", "premium", "small-lora", 8, 0, 5 * HOUR, 0.25 * HOUR, 0.25 * HOUR)],
                      [24 * HOUR, 16 * HOUR, 11 * HOUR, 13 * HOUR, 15 * HOUR])
    assert result["finished"] == 5 and result["misses"] == 0
    assert result["stops"] == {"reclaim": 0, "move": 0, "tier": 3}
    assert result["max_spot_preemptions_one_job"] == 0 and result["left_spot"] == 0
    # on demand: the premium job of 20 h on 4 GPUs, nothing else
    assert result["gpu_h"] - result["spot_gpu_h"] == pytest.approx(4 * 20.0)


def test_a_job_spot_would_make_late_waits_for_on_demand_instead_of_going_round() -> None:
    # Node n00 is spot, n01 on demand, no reclaims. A premium job holds n01 for 1.5 h (its deadline
    # of 1.6 h keeps it off spot) and a standard job holds n00 for 1.2 h (deadline a day off: spot).
    # Job x, 8 GPUs, 2 h of work, arrives at 1 min with its deadline at 3.6 h: spot fits (1.25 x 2 h)
    # until 1.1 h. When n00 frees at 1.2 h, x is over an hour old; counted from its creation, that
    # wait sent it back to spot, and `at_risk` moved it off again at the next decision (on-demand
    # could still make it), once a minute until n01 freed. Now it stays off spot and starts on
    # on-demand at 1.5 h, in time.
    result = run_auto(["--nodes", "2", "--spot-share", "0.5", "--spot-reclaims-per-node-hour", "0"],
                      [("od", "p01", "premium", "70b-lora", 8, 0, 0.0, 1.5 * HOUR, 1.5 * HOUR),
                       ("sp", "s01", "standard", "70b-lora", 8, 0, 0.0, 1.2 * HOUR, 1.2 * HOUR),
                       ("x", "s02", "standard", "70b-lora", 8, 0, 60.0, 2 * HOUR, 2 * HOUR)],
                      [1.6 * HOUR, 24 * HOUR, 3.6 * HOUR])
    assert result["finished"] == 3 and result["misses"] == 0
    assert result["stops"]["move"] == 0 and result["moved_jobs"] == 0
    # on demand: the premium job's 1.5 h and x's 2 h, 8 GPUs each; on spot only the standard job's 1.2 h
    assert result["gpu_h"] - result["spot_gpu_h"] == pytest.approx(8 * 3.5)
    assert result["spot_gpu_h"] == pytest.approx(8 * 1.2)


def test_a_job_kept_off_spot_returns_only_after_waiting_since_it_was_last_queued(results: dict[str, dict]) -> None:
    # In the scaled-down run, auto jobs reach their preemption allowance. `_back_to_spot` lets one
    # back on spot only if its deadline is lost anyway or it waited 2 x spot_max_wait_s since its
    # last attempt ended; counted from its creation instead, it would go back at once.
    auto = results["auto"]
    assert auto["left_spot"] > 0, "no job reached its preemption allowance: nothing is checked"
    for waited, deadline_lost in auto["back_on_spot_after"]:
        assert deadline_lost or waited >= 2 * 1800.0
    assert auto["max_moves_one_job"] <= 1  # no job moved off spot over and over
