"""Scheduling policy on constructed situations."""

from __future__ import annotations

from tuneforge.planning.policy import (
    Hold,
    Node,
    PolicyConfig,
    QueuedJob,
    QueueIndex,
    RunningJob,
    choose_victims,
    decide,
    iter_queue,
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
    assert list(iter_queue(queue, CONFIG, usage)) == order_queue(queue, CONFIG, usage)
    # the index merges per-(tier, tenant) groups; jobs leave and come back (requeued: same queue time)
    index = QueueIndex(rng.sample(queue, len(queue)))
    for gone in queue[:50]:
        index.remove(gone.job_id)
    for back in queue[:25]:
        index.add(back)
    rest = queue[:25] + queue[50:]
    assert len(index) == len(rest)
    assert list(iter_queue(index, CONFIG, usage)) == order_queue(rest, CONFIG, usage)


def test_jobs_queued_in_the_same_second_keep_their_arrival_order():
    same = [QueuedJob(f"job-{name}", "t1", "standard", 1, 100.0, 60.0, seq=seq)
            for name, seq in [("zz", 1), ("aa", 2), ("mm", 3)]]
    assert [j.job_id for j in iter_queue(QueueIndex(same), CONFIG, {})] == ["job-zz", "job-aa", "job-mm"]


def test_an_aged_lower_tier_job_is_preempted_and_cannot_take_the_gpus_back():
    now = 100_000.0
    # a standard job queued 14 h ago ranks ahead of a fresh premium job once requeued (12 h per tier)
    aged = RunningJob("aged-std", "t9", "standard", {"n0": tuple(range(8))}, now - 3600, now + 9e4, now - 60, 0.1,
                      queued_at=now - 14 * 3600)
    urgent = job("p", "premium", gpus=8, queued_at=now - 400)
    first = decide([urgent], nodes(0), [aged], now, TARGET)
    [(for_job, victims, landing)] = first.preemptions
    assert for_job.job_id == "p" and [v.job_id for v in victims] == ["aged-std"]
    [hold] = first.holds(now, TARGET)
    # the victim exits and is queued again, ahead of the premium job in queue order ...
    requeued = job("aged-std", "standard", gpus=8, queued_at=now - 14 * 3600, tenant="t9")
    assert [j.job_id for j in order_queue([urgent, requeued], TARGET, {})] == ["aged-std", "p"]
    # ... but the GPUs were freed for the premium job, and it gets them
    after = decide([urgent, requeued], nodes(8), [], now + 30, TARGET, holds={"p": hold})
    assert [(j.job_id, a) for j, a in after.starts] == [("p", landing)]
    assert after.blocked.job_id == "aged-std"  # first in line for what frees next


def test_a_running_job_past_its_estimate_is_not_expected_to_end_now():
    busy = [RunningJob("late", "t9", "free", {"n0": tuple(range(8))}, 0.0, 1000.0, 0.0, 1.0)]
    # 1,000 s estimated, 2,000 s running: expected to need a quarter of its estimate more
    assert reserve(job("x", gpus=8), nodes(0), busy, now=2000.0, config=CONFIG).start == 2250.0
    short = [RunningJob("late", "t9", "free", {"n0": tuple(range(8))}, 0.0, 100.0, 0.0, 1.0)]
    assert reserve(job("x", gpus=8), nodes(0), short, now=2000.0, config=CONFIG).start == 2060.0  # at least 60 s


TARGET = PolicyConfig(aging_s=43200.0, target_wait_s={"premium": 300.0, "standard": None, "free": None})


def test_a_premium_job_that_would_wait_past_its_target_preempts_at_once():
    now = 10_000.0
    busy = [RunningJob("std-long", "t9", "standard", {"n0": (0, 1, 2, 3)}, 9000.0, now + 7200.0, 9900.0, 0.1,
                       queued_at=9000.0),
            RunningJob("std-soon", "t8", "standard", {"n0": (4, 5, 6, 7)}, 9000.0, now + 120.0, 9000.0, 0.9,
                       queued_at=9000.0)]
    # 4 GPUs free in 2 h: far past the 5-minute target, so it preempts on arrival
    urgent = job("p", "premium", gpus=8, queued_at=now)
    decision = decide([urgent], nodes(0), busy, now, TARGET)
    assert decision.starts == []
    [(for_job, victims, landing)] = decision.preemptions
    assert for_job.job_id == "p" and sorted(v.job_id for v in victims) == ["std-long", "std-soon"]
    assert landing == {"n0": tuple(range(8))}
    # 1 GPU frees in 2 minutes: within the target, nobody is preempted
    patient = job("q", "premium", gpus=1, queued_at=now)
    assert decide([patient], nodes(0), busy, now, TARGET).preemptions == []
    # ... until it has waited past the target after all
    assert [v.job_id for v in decide([patient], nodes(0), busy, now + 301.0, TARGET).victims] == ["std-long"]


def test_gpus_freed_by_preemption_are_held_for_the_job_they_were_freed_for():
    now = 10_000.0
    urgent = job("p", "premium", gpus=4, queued_at=now - 400.0)
    # an aged standard job ranks ahead of the premium one and would take the freed GPUs
    aged = job("aged", "standard", gpus=4, queued_at=now - 50_000.0, tenant="t2")
    hold = Hold("p", {"n0": (0, 1, 2, 3)}, until=now + 600.0)
    # the victim has not exited yet: nothing starts on the held GPUs, nobody else gets them
    waiting = decide([urgent, aged], nodes(0), [], now, TARGET, holds={"p": hold})
    assert waiting.starts == []
    freed = [Node("n0", 8, {0, 1, 2, 3})]  # the victim exited
    started = decide([urgent, aged], freed, [], now, TARGET, holds={"p": hold})
    assert [(j.job_id, a) for j, a in started.starts] == [("p", {"n0": (0, 1, 2, 3)})]
    # without the hold the aged job would have taken them
    assert [j.job_id for j, _ in decide([urgent, aged], freed, [], now, TARGET).starts] == ["aged"]
    # a lapsed hold is ignored
    lapsed = decide([urgent, aged], freed, [], now, TARGET, holds={"p": Hold("p", hold.assignment, now - 1)})
    assert [j.job_id for j, _ in lapsed.starts] == ["aged"]


def test_several_jobs_may_preempt_in_one_decision_without_sharing_victims():
    now = 10_000.0
    busy = [RunningJob(f"free-{i}", "t9", "free", {f"n{i}": tuple(range(8))}, 0.0, now + 86_400.0, 9000.0, 0.1,
                       queued_at=5000.0 + i) for i in range(3)]
    waiting = [job(f"p{i}", "premium", gpus=8, queued_at=now, tenant=f"t{i}") for i in range(2)]
    decision = decide(QueueIndex(waiting), nodes(0, 0, 0), busy, now, TARGET)
    assert [j.job_id for j, _v, _l in decision.preemptions] == ["p0", "p1"]
    victims = [[v.job_id for v in victims] for _j, victims, _l in decision.preemptions]
    assert len(victims[0]) == 1 and len(victims[1]) == 1 and victims[0] != victims[1]
    assert {n for _j, _v, landing in decision.preemptions for n in landing} == \
        {next(iter(b.placement)) for b in busy if b.job_id in victims[0] + victims[1]}
    # the jobs already asked to stop count as freeing their GPUs: no second round of victims
    again = decide(QueueIndex(waiting), nodes(0, 0, 0), busy, now + 1, TARGET,
                   stopping={v for vs in victims for v in vs})
    assert again.victims == []


def test_a_job_at_its_tenants_concurrency_cap_never_preempts():
    now = 10_000.0
    busy = [RunningJob("free", "t9", "free", {"n0": tuple(range(8))}, 0.0, now + 86_400.0, 9000.0, 0.1)]
    capped = decide([job("p", "premium", gpus=8, queued_at=now - 1000.0)], nodes(0), busy, now, TARGET,
                    can_start=lambda j: False)
    assert capped.preemptions == [] and capped.starts == []


def test_policy_config_from_settings_takes_the_operators_aging_and_premium_target(tmp_path):
    from tuneforge.settings import Settings

    settings = Settings(home=tmp_path, scheduler_aging_s=7200.0, premium_target_wait_s=90.0)
    config = PolicyConfig.from_settings(settings)
    assert config.aging_s == 7200.0
    assert config.target_wait_s == {"premium": 90.0, "standard": None, "free": None}
    defaults = PolicyConfig()
    assert (config.fair_share_s_per_gpu_hour, config.hold_s, config.backfill_depth) == \
        (defaults.fair_share_s_per_gpu_hour, defaults.hold_s, defaults.backfill_depth)
