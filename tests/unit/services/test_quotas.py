"""The one quota rule (`quotas.refusal`) for both of its callers: admission at job create and
the scheduler's start decision (`quotas.start_gate`)."""

from __future__ import annotations

import pytest

from tests.helpers.platform import add_tenant, make_platform
from tuneforge.db.repos import tenants as tenant_repo
from tuneforge.services.tenancy import quotas
from tuneforge.services.tenancy import tenants as tenant_service
from tuneforge.services.tenancy.quotas import Limits, Refusal, Standing, refusal

FREE = quotas.TIER_DEFAULTS["free"]  # 1 running, 3 waiting, 10 GPU-h hard, 5 soft
NO_LIMITS = Limits(None, None, None, None)


# ---- create (admission) ------------------------------------------------------------------------
def test_create_is_refused_at_the_hard_cap_from_equality_on():
    assert refusal(FREE, Standing(gpu_hours=9.99), "create") is None
    assert refusal(FREE, Standing(gpu_hours=10.0), "create") == Refusal("gpu_hours_hard", 10.0, 10.0)
    assert refusal(FREE, Standing(gpu_hours=12.5), "create") == Refusal("gpu_hours_hard", 12.5, 10.0)


def test_create_is_refused_at_the_queue_limit_and_the_cap_is_named_first():
    assert refusal(FREE, Standing(waiting=2), "create") is None
    assert refusal(FREE, Standing(waiting=3), "create") == Refusal("max_queued_jobs", 3, 3)
    both = refusal(FREE, Standing(waiting=3, gpu_hours=10.0), "create")
    assert both is not None and both.limit == "gpu_hours_hard"


def test_create_ignores_running_jobs_and_no_limit_refuses_nothing():
    assert refusal(FREE, Standing(holding=5), "create") is None
    assert refusal(NO_LIMITS, Standing(holding=10**6, waiting=10**6, gpu_hours=1e9), "create") is None
    assert refusal(NO_LIMITS, Standing(holding=10**6, waiting=10**6, gpu_hours=1e9), "start") is None


# ---- start (the scheduler) ---------------------------------------------------------------------
def test_start_is_refused_once_the_tenant_holds_max_concurrent_jobs():
    standard = quotas.TIER_DEFAULTS["standard"]  # 4 at once
    assert refusal(standard, Standing(holding=3), "start") is None
    assert refusal(standard, Standing(holding=4), "start") == Refusal("max_concurrent_jobs", 4, 4)
    suspended = Limits(0, None, None, None)  # a limit of 0: nothing starts
    assert refusal(suspended, Standing(), "start") == Refusal("max_concurrent_jobs", 0, 0)


def test_start_is_not_held_by_the_hard_cap_nor_by_waiting_jobs():
    # a job admitted under the cap runs even if the tenant crossed the cap meanwhile
    assert refusal(FREE, Standing(gpu_hours=50.0, waiting=3), "start") is None


def test_an_unknown_action_is_an_error():
    with pytest.raises(ValueError):
        refusal(FREE, Standing(), "delete")  # type: ignore[arg-type]


def test_start_gate_counts_the_starts_it_allows_in_a_tick(tmp_path, database_url):
    platform = make_platform(tmp_path, database_url)
    add_tenant(platform, "solo", "free")  # 1 at once
    add_tenant(platform, "team", "standard")
    add_tenant(platform, "open", "premium")
    try:
        with platform.db.session() as session:
            tenant_service.set_quota(session, "team", {"max_concurrent_jobs": 2})
            tenant_service.set_quota(session, "open", {"max_concurrent_jobs": quotas.UNLIMITED})
        with platform.db.session() as session:
            ids = {name: tenant_repo.by_name(session, name).tenant_id for name in ("solo", "team", "open")}
            gate = quotas.start_gate(session, {ids["team"]: 1, ids["open"]: 500})
            assert [gate(ids["solo"]), gate(ids["solo"])] == [True, False]
            assert [gate(ids["team"]), gate(ids["team"])] == [True, False]  # 1 held + 1 started = its 2
            assert all(gate(ids["open"]) for _ in range(10))
            assert gate("tenant-without-a-row") and gate("tenant-without-a-row")
            assert quotas.start_gate(session, {ids["solo"]: 1})(ids["solo"]) is False
    finally:
        platform.db.dispose()
