"""The scheduler simulator's heterogeneous GPUs (`benchmarks/scheduler_sim.py --hardware`), scaled
down: a quarter of a day on the default A100-40G / A100-80G / H100 nodes. Whatever the exact
figures, the hardware rule places nothing on wrong GPUs and fails no job, and the rule before it
(GPU counts only) does both on the same trace."""

from __future__ import annotations

from tests.unit.test_scheduler_sim_pools import load_sim


def test_the_hardware_rule_never_places_on_wrong_gpus_and_counting_gpus_only_does():
    sim = load_sim()
    args = sim.build_parser().parse_args(["--hardware", "--seed", "0", "--days", "0.25"])
    hardware = sim.hardware_module()
    results = {r["rule"]: r for r in hardware.hardware_main(args, "test")}
    assert results["hardware"]["wrong"] == 0 and results["hardware"]["failed"] == 0
    assert results["count only"]["wrong"] > 0 and results["count only"]["failed"] > 0
    assert results["hardware"]["useful"] > results["count only"]["useful"]
    assert results["hardware"]["finished"] == len(results["hardware"]["runs"]) > 100
