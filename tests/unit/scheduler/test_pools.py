"""Capacity pools as the policy applies them: which pools a job may start on (cheapest first,
spot only while it can meet the deadline, on-demand after too many preemptions), when a running
spot job must move, and placement on the first allowed pool with room."""

from __future__ import annotations

import pytest

from tuneforge.planning.policy import Node, QueuedJob, place
from tuneforge.planning.pools import (
    SAFETY,
    CapacityAsk,
    Pool,
    PoolSetup,
    SpotRules,
    allowed_pools,
    at_risk,
    preemption_allowance,
    spot_duration_s,
)
from tuneforge.settings import Settings

SPOT_POOL = Pool("spot", "spot", 1.2, preemptions_per_hour=0.5)
ON_DEMAND = Pool("od", "on_demand", 4.0)
RESERVED = Pool("res", "reserved", 2.5)
POOLS = [ON_DEMAND, SPOT_POOL, RESERVED]
RULES = SpotRules(max_preemptions=2, max_wait_s=1800.0, checkpoint_interval_s=600.0, restart_s=120.0)
HOUR = 3600.0


def test_spot_duration_counts_the_work_each_expected_preemption_loses():
    # 0.5 reclaims per hour, each losing 300 s of work and 120 s of restart: 0.5 * 420/3600 more time
    assert spot_duration_s(HOUR, SPOT_POOL, RULES) == pytest.approx(HOUR * (1 + 0.5 * 420 / 3600))


@pytest.mark.parametrize("ask, expected", [
    (CapacityAsk("on_demand"), ("res", "od")),
    (CapacityAsk("spot"), ("spot",)),
    (CapacityAsk("auto", queued_at=0.0), ("spot",)),  # no deadline, has not waited long: spot only
    (CapacityAsk("auto", queued_at=-2000.0), ("spot", "res", "od")),  # waited past spot_max_wait_s
    (CapacityAsk("auto", spot_preemptions=3, queued_at=-3700.0), ("spot", "res", "od")),  # kept waiting: back
    (CapacityAsk("auto", spot_preemptions=3), ("res", "od")),  # preempted more than 2 beyond the 0.5 expected
    (CapacityAsk("auto", max_price=3.0), ("spot",)),
    (CapacityAsk("on_demand", max_price=3.0), ("res",)),
    (CapacityAsk("spot", max_price=1.0), ()),  # nothing it would pay for: it waits
])
def test_allowed_pools_cheapest_first(ask, expected):
    assert allowed_pools(ask, HOUR, POOLS, now=0.0, rules=RULES) == expected


def test_a_deadline_keeps_spot_only_while_it_can_still_be_met():
    expected_spot = SAFETY * spot_duration_s(HOUR, SPOT_POOL, RULES)
    roomy = CapacityAsk("auto", deadline=expected_spot + RULES.max_wait_s + 60)
    assert allowed_pools(roomy, HOUR, POOLS, now=0.0, rules=RULES) == ("spot",)
    # spot still meets it, but waiting for spot would eat the slack: on-demand is allowed too
    tight = CapacityAsk("auto", deadline=expected_spot + 60)
    assert allowed_pools(tight, HOUR, POOLS, now=0.0, rules=RULES) == ("spot", "res", "od")
    # spot's expected slowdown would miss it: on-demand only
    too_tight = CapacityAsk("auto", deadline=expected_spot - 60)
    assert allowed_pools(too_tight, HOUR, POOLS, now=0.0, rules=RULES) == ("res", "od")


def test_the_preemption_allowance_grows_with_the_jobs_size_and_length():
    assert preemption_allowance(HOUR, SPOT_POOL, RULES) == pytest.approx(2.5)
    assert preemption_allowance(10 * HOUR, SPOT_POOL, RULES, nodes=4) == pytest.approx(2 + 4 * 10 * 0.5)
    big = CapacityAsk("auto", spot_preemptions=10, nodes=4)
    assert allowed_pools(big, 10 * HOUR, POOLS, now=0.0, rules=RULES) == ("spot",)  # 10 < 22 expected-ish
    # a 4-node job is reclaimed 4 times as often: its expected run is longer
    assert spot_duration_s(HOUR, SPOT_POOL, RULES, nodes=4) == pytest.approx(HOUR * (1 + 4 * 0.5 * 420 / 3600))


def test_waiting_counts_from_the_last_requeue_and_never_undoes_a_deadline_move():
    # created long ago, but requeued a minute ago after its third reclaim: it waits for on-demand
    recent = CapacityAsk("auto", spot_preemptions=3, queued_at=-10 * HOUR, waiting_since=-60.0)
    assert allowed_pools(recent, HOUR, POOLS, now=0.0, rules=RULES) == ("res", "od")
    # moved off spot because spot's slowdown would make it late: waiting does not send it back
    expected_spot = SAFETY * spot_duration_s(HOUR, SPOT_POOL, RULES)
    late_on_spot = CapacityAsk("auto", deadline=(expected_spot + HOUR) / 2, waiting_since=-5 * HOUR)
    assert allowed_pools(late_on_spot, HOUR, POOLS, now=0.0, rules=RULES) == ("res", "od")


def test_past_its_deadline_a_job_takes_whatever_is_cheapest():
    late = CapacityAsk("auto", deadline=HOUR / 2, spot_preemptions=9)
    assert allowed_pools(late, HOUR, POOLS, now=0.0, rules=RULES) == ("spot", "res", "od")


def test_a_running_spot_job_moves_when_its_deadline_is_at_risk():
    ask = CapacityAsk("auto", deadline=10 * HOUR)
    assert not at_risk(ask, HOUR, SPOT_POOL, now=0.0, rules=RULES)
    assert at_risk(ask, HOUR, SPOT_POOL, now=10 * HOUR - HOUR, rules=RULES)
    assert not at_risk(ask, HOUR, ON_DEMAND, now=9 * HOUR, rules=RULES)  # only spot jobs move
    assert not at_risk(CapacityAsk("spot", deadline=HOUR), HOUR, SPOT_POOL, now=0.0, rules=RULES)  # chose spot
    # too late for on-demand too: moving won't help
    assert not at_risk(ask, HOUR, SPOT_POOL, now=9.5 * HOUR, rules=RULES)


def _nodes() -> list[Node]:
    return [Node("a", 4, set(range(4)), "od"), Node("b", 4, set(range(4)), "spot")]


def test_a_job_limited_to_pools_lands_on_the_first_with_room():
    job = QueuedJob("j", "t", "standard", gpus=2, queued_at=0.0, runtime_s=HOUR, pools=("spot", "od"))
    assert place(job, _nodes()) == {"b": (0, 1)}
    full_spot = _nodes()
    full_spot[1].free = {3}
    assert place(job, full_spot) == {"a": (0, 1)}
    assert place(QueuedJob("j", "t", "standard", 2, 0.0, HOUR, pools=("spot",)), full_spot) is None
    assert place(QueuedJob("j", "t", "standard", 2, 0.0, HOUR, pools=()), _nodes()) is None
    # no pools asked (none configured): any node, as before
    assert place(QueuedJob("j", "t", "standard", 2, 0.0, HOUR), full_spot) == {"a": (0, 1)}


def test_the_setup_from_settings_prices_pools_and_maps_nodes():
    settings = Settings(capacity_pools={
        "spot": {"kind": "spot", "price_per_gpu_hour": 1.2, "preemptions_per_hour": 0.1, "nodes": ["local-1"]},
        "od": {"kind": "on_demand", "price_per_gpu_hour": 4.0, "nodes": ["local"]}},
        price_per_gpu_hour={"default": 3.0}, spot_max_preemptions=3)
    setup = PoolSetup.from_settings(settings)
    assert setup.node_pool("local-1") == "spot" and setup.node_pool("local") == "od"
    assert setup.node_pool("ray-node-7", reported="spot") == "spot"  # a node that says its pool
    assert setup.node_pool("elsewhere") == ""
    assert (setup.price("spot"), setup.price("od"), setup.price(""), setup.on_demand_price()) == (1.2, 4.0, 3.0, 4.0)
    assert setup.rules.max_preemptions == 3
    assert setup.ask("free", "", None, None, 0, 0.0).capacity == "spot"
    assert setup.ask("premium", "", None, None, 0, 0.0).capacity == "on_demand"
    assert setup.ask("premium", "auto", None, None, 0, 0.0).capacity == "auto"
    assert PoolSetup.from_settings(Settings()) is None


@pytest.fixture
def pooled(tmp_path, database_url, tiny_model_dir):
    """An API whose platform has one on-demand pool (node local) and one reserved (local-1), no spot."""
    import io

    from fastapi.testclient import TestClient

    from tests.helpers.platform import add_base_model, add_tenant, chat_lines, make_platform
    from tuneforge.api.app import create_app

    platform = make_platform(tmp_path, database_url, local_gpus=1, local_nodes=2, capacity_pools={
        "od": {"kind": "on_demand", "price_per_gpu_hour": 4.0, "nodes": ["local"]},
        "res": {"kind": "reserved", "price_per_gpu_hour": 2.0, "nodes": ["local-1"]}})
    add_base_model(platform, "tiny-base", tiny_model_dir)
    auth = {"Authorization": f"Bearer {add_tenant(platform, 'acme')}"}
    http = TestClient(create_app(platform=platform))
    file_id = http.post("/v1/files", files={"file": ("t.jsonl", io.BytesIO(chat_lines(20)))},
                        data={"purpose": "fine-tune"}, headers=auth).json()["id"]

    def create(resources: dict):  # noqa: ANN202
        return http.post("/v1/fine_tuning/jobs", headers=auth, json={
            "model": "tiny-base", "training_file": file_id, "resources": resources})

    yield http, auth, create
    http.close()
    platform.db.dispose()


def test_a_job_no_pool_can_take_fails_validation_naming_the_field(pooled):
    http, auth, create = pooled
    for resources, param, words in (({"capacity": "spot"}, "resources.capacity", "no spot capacity pool"),
                                    ({"max_price": 1.5}, "resources.max_price", "at 1.5 or less per GPU-hour")):
        created = create(resources)
        assert created.status_code == 200, created.text
        job = http.get(f"/v1/fine_tuning/jobs/{created.json()['id']}", headers=auth).json()
        assert job["status"] == "failed", (resources, job)
        assert job["error"]["code"] == "resources_unavailable" and job["error"]["param"] == param
        assert words in job["error"]["message"], job["error"]["message"]
    fine = create({"capacity": "on_demand", "max_price": 2.5})
    assert http.get(f"/v1/fine_tuning/jobs/{fine.json()['id']}", headers=auth).json()["status"] == "queued"


def test_a_deadline_in_the_past_is_refused(pooled):
    _http, _auth, create = pooled
    refused = create({"deadline": 1_000})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "resources.deadline"
    assert create({"capacity": "cheap"}).json()["error"]["param"] == "resources.capacity"
