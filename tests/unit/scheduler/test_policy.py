"""Scheduling policy on constructed situations."""

from __future__ import annotations

from tuneforge.scheduler.policy import (
    Node,
    PolicyConfig,
    QueuedJob,
    RunningJob,
    choose_victims,
    order_queue,
    place,
    plan,
    reserve,
)

CONFIG = PolicyConfig(aging_s=3600.0, fair_share_s_per_gpu_hour=60.0, fair_share_max_s=1800.0)


def job(job_id, tier="standard", gpus=1, queued_at=0.0, runtime_s=600.0, tenant="t1", per_node=0):
    return QueuedJob(job_id, tenant, tier, gpus, queued_at, runtime_s, per_node)


def nodes(*free_counts, size=8):
    return [Node(f"n{i}", size, set(range(size - count, size))) for i, count in enumerate(free_counts)]


def running(job_id, placement, end, tier="free", checkpoint_at=0.0, progress=0.5, tenant="t9"):
    return RunningJob(job_id, tenant, tier, placement, 0.0, end, checkpoint_at, progress)


def test_tiers_first_fifo_within_and_aging_overtakes():
    queue = [job("free-old", "free", queued_at=0.0), job("prem", "premium", queued_at=7000.0),
             job("std-new", "standard", queued_at=5000.0), job("std-old", "standard", queued_at=1000.0)]
    order = [j.job_id for j in order_queue(queue, CONFIG, {})]
    # waiting aging_s is worth one tier: free-old (queued at 0) ranks like a premium job queued at 7200,
    # so just behind prem (7000) and ahead of std-new (a premium job queued at 8600)
    assert order == ["std-old", "prem", "free-old", "std-new"]
    fresh = [job("free", "free", queued_at=100.0), job("prem", "premium", queued_at=100.0)]
    assert [j.job_id for j in order_queue(fresh, CONFIG, {})] == ["prem", "free"]


def test_fair_share_within_a_tier_by_recent_usage():
    queue = [job("heavy-1", tenant="heavy", queued_at=0.0), job("light-1", tenant="light", queued_at=100.0)]
    assert [j.job_id for j in order_queue(queue, CONFIG, {"heavy": 10.0})] == ["light-1", "heavy-1"]
    assert [j.job_id for j in order_queue(queue, CONFIG, {"heavy": 1.0})] == ["heavy-1", "light-1"]
    capped = order_queue([job("heavy", tenant="heavy", queued_at=0.0, tier="premium"),
                          job("light", tenant="light", queued_at=0.0, tier="standard")], CONFIG, {"heavy": 1e6})
    assert capped[0].job_id == "heavy"  # fair share never outweighs a tier (capped below aging_s)


def test_gang_placement_never_splits_and_prefers_the_fullest_node():
    inventory = nodes(3, 3, 6)
    assert place(job("a", gpus=4), inventory) == {"n2": (2, 3, 4, 5)}
    assert place(job("b", gpus=3), inventory) == {"n0": (5, 6, 7)}  # fullest that fits
    assert place(job("c", gpus=7), inventory) is None  # 12 free in all, never split


def test_multi_node_jobs_take_whole_nodes_or_nothing():
    inventory = nodes(8, 8, 8, 7)
    big = job("big", gpus=32, per_node=8)
    assert place(big, inventory) is None  # the fourth node has 7 free
    inventory[3].free.add(0)
    placed = place(big, inventory)
    assert placed is not None and sorted(placed) == ["n0", "n1", "n2", "n3"]
    assert all(len(ids) == 8 for ids in placed.values())


def test_backfill_never_delays_the_heads_reservation():
    # one node of 8: 6 busy until t=1000, 2 free now; the head wants 8
    inventory = nodes(2)
    busy = [running("r1", {"n0": tuple(range(6))}, end=1000.0)]
    head = job("head", gpus=8, queued_at=0.0)
    short = job("short", gpus=2, queued_at=10.0, runtime_s=500.0)   # ends at 500 < 1000: may go
    long = job("long", gpus=2, queued_at=20.0, runtime_s=5000.0)    # would hold GPUs the head needs
    result = plan([head, short], inventory, busy, now=0.0, config=CONFIG)
    assert result.blocked.job_id == "head" and result.reservation.start == 1000.0
    assert [j.job_id for j, _ in result.starts] == ["short"]
    result = plan([head, long], inventory, busy, now=0.0, config=CONFIG)
    assert result.starts == []


def test_backfill_on_gpus_the_reservation_does_not_need():
    inventory = nodes(2, 1)  # n0: 2 free, n1: 1 free
    busy = [running("r1", {"n0": tuple(range(6))}, end=1000.0),
            running("r2", {"n1": tuple(range(7))}, end=9000.0)]
    head = job("head", gpus=8)
    long_small = job("long", gpus=1, runtime_s=99999.0)
    result = plan([head, long_small], inventory, busy, now=0.0, config=CONFIG)
    assert result.reservation.assignment == {"n0": tuple(range(8))}
    assert [(j.job_id, a) for j, a in result.starts] == [("long", {"n1": (7,)})]


def test_reservation_time_follows_expected_ends():
    inventory = nodes(0, 0)
    busy = [running("a", {"n0": tuple(range(8))}, end=300.0), running("b", {"n1": tuple(range(8))}, end=100.0)]
    assert reserve(job("x", gpus=8), inventory, busy, now=0.0).start == 100.0
    assert reserve(job("y", gpus=16, per_node=8), inventory, busy, now=0.0).start == 300.0
    assert reserve(job("z", gpus=24, per_node=8), inventory, busy, now=0.0) is None


def test_victims_lose_the_least_work_and_only_as_many_as_needed():
    inventory = nodes(0, 0)
    now = 1000.0
    busy = [
        running("std-fresh-ckpt", {"n0": (0, 1, 2, 3)}, end=9e9, tier="standard", checkpoint_at=990.0),
        running("free-old-ckpt", {"n0": (4, 5, 6, 7)}, end=9e9, tier="free", checkpoint_at=100.0),
        running("free-fresh-ckpt", {"n1": (0, 1, 2, 3)}, end=9e9, tier="free", checkpoint_at=995.0),
        running("premium", {"n1": (4, 5, 6, 7)}, end=9e9, tier="premium", checkpoint_at=0.0),
    ]
    victims = choose_victims(job("p", "premium", gpus=4), inventory, busy, now)
    assert [v.job_id for v in victims] == ["free-fresh-ckpt"]  # 5 s since its checkpoint
    victims = choose_victims(job("p", "premium", gpus=8), inventory, busy, now)
    assert sorted(v.job_id for v in victims) == ["free-old-ckpt", "std-fresh-ckpt"]  # one whole node
    assert choose_victims(job("p", "standard", gpus=8), inventory, busy, now) is None  # only free-tier victims
    assert choose_victims(job("p", "premium", gpus=1), nodes(1, 0), busy, now) == []  # fits already


def test_a_small_job_never_sends_a_multi_node_job_back_when_small_victims_would_do():
    inventory = nodes(0, 0, 0)
    now = 1000.0
    busy = [
        # a 2-node job checkpointed just now: cheapest by time, but it holds 16 GPUs
        running("big", {"n0": tuple(range(8)), "n1": tuple(range(8))}, end=9e9, tier="free", checkpoint_at=999.0),
        running("small-a", {"n2": (0, 1, 2, 3)}, end=9e9, tier="standard", checkpoint_at=400.0),
        running("small-b", {"n2": (4, 5, 6, 7)}, end=9e9, tier="standard", checkpoint_at=300.0),
    ]
    victims = choose_victims(job("p", "premium", gpus=2), inventory, busy, now)
    assert [v.job_id for v in victims] == ["small-a"]  # 4 GPUs taken, not 16


def test_lazy_order_equals_the_sorted_order():
    import random

    rng = random.Random(3)
    queue = [job(f"j{i}", rng.choice(["free", "standard", "premium"]), queued_at=rng.uniform(0, 1e4),
                 tenant=f"t{rng.randrange(5)}") for i in range(500)]
    usage = {f"t{i}": rng.uniform(0, 50) for i in range(5)}
    from tuneforge.scheduler.policy import iter_queue

    assert list(iter_queue(queue, CONFIG, usage)) == order_queue(queue, CONFIG, usage)


def test_a_job_that_would_outrank_the_waiting_job_is_never_a_victim():
    inventory = nodes(0)
    now = 10_000.0
    # a standard job queued at 0 ranks like a premium job queued at 3600: ahead of a premium job queued at 9000
    aged = RunningJob("aged-std", "t9", "standard", {"n0": tuple(range(8))}, 5000.0, 9e9, 9999.0, 0.1,
                      queued_at=0.0)
    urgent = job("p", "premium", gpus=8, queued_at=9000.0)
    assert choose_victims(urgent, inventory, [aged], now, config=CONFIG) is None  # it would take the GPUs back
    fresh = RunningJob("fresh-std", "t9", "standard", {"n0": tuple(range(8))}, 9500.0, 9e9, 9999.0, 0.1,
                       queued_at=9500.0)
    assert [v.job_id for v in choose_victims(urgent, inventory, [fresh], now, config=CONFIG)] == ["fresh-std"]
