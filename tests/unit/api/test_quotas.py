"""Tiers and quotas: defaults, overrides, admission at job create, the scheduler's start check."""

from __future__ import annotations

import io
import time
from dataclasses import fields

import openai
import pytest
from sqlalchemy import func, select

from tests.helpers.cli import Done, run
from tests.helpers.platform import add_tenant, chat_lines
from tests.unit.api.test_usage import add_attempt, add_job
from tuneforge.db.repos import tenants as tenant_repo
from tuneforge.db.tables import Job, Tenant
from tuneforge.domain.errors import ApiError
from tuneforge.domain.vocab import TIERS
from tuneforge.services.tenancy import quotas, usage
from tuneforge.services.tenancy import tenants as tenant_service

HOUR = 3600.0


def _upload(world, key: str) -> str:
    return world.sdk(key).files.create(file=("train.jsonl", io.BytesIO(chat_lines(20))), purpose="fine-tune").id


def _create(world, key: str, training: str, **headers: str):
    return world.http.post("/v1/fine_tuning/jobs", json={"model": world.base_model, "training_file": training},
                           headers={**world.headers(key), **headers})


def _jobs_of(world, name: str, status: str | None = None) -> int:
    with world.platform.db.session() as session:
        tenant_id = tenant_repo.by_name(session, name).tenant_id
        stmt = select(func.count()).select_from(Job).where(Job.tenant_id == tenant_id)
        if status is not None:
            stmt = stmt.where(Job.status == status)
        return session.scalar(stmt)


def _set_status(world, job_id: str, status: str) -> None:
    with world.platform.db.session() as session:
        session.scalar(select(Job).where(Job.job_id == job_id)).status = status


def _set_quota(world, name: str, **changes: float | None) -> None:
    with world.platform.db.session() as session:
        tenant_service.set_quota(session, name, changes)


def _this_month_start() -> float:
    return usage.month_bounds(usage.current_month(time.time()))[0]


def _used(world, name: str, gpu_hours: float, *, at: float | None = None, failure_class: str | None = None) -> None:
    """A finished one-GPU attempt of `gpu_hours`, starting a minute into this month (or at `at`)."""
    start = (at if at is not None else _this_month_start()) + 60
    job_id = add_job(world.platform, name)
    add_attempt(world.platform, job_id, 1, started_at=start, ended_at=start + gpu_hours * HOUR,
                status="failed" if failure_class else "succeeded", failure_class=failure_class)


# ---- limits ----------------------------------------------------------------------------
def test_every_tier_has_defaults_and_higher_tiers_get_more():
    assert set(quotas.TIER_DEFAULTS) == set(TIERS)
    order = [quotas.TIER_DEFAULTS[tier] for tier in ("free", "standard", "premium")]
    for name in quotas.QUOTA_FIELDS:
        values = [getattr(limits, name) for limits in order]
        as_numbers = [float("inf") if value is None else value for value in values]
        assert as_numbers == sorted(as_numbers), name
    assert quotas.TIER_DEFAULTS["premium"].gpu_hours_hard is None
    assert quotas.TIER_DEFAULTS["free"] == quotas.Limits(1, 3, 10.0, 5.0)


def test_tenant_overrides_take_precedence_and_minus_one_lifts_a_limit():
    assert quotas.limits(Tenant(tier="premium")) == quotas.TIER_DEFAULTS["premium"]
    tenant = Tenant(tier="free", max_concurrent_jobs=2, gpu_hours_hard=quotas.UNLIMITED, gpu_hours_soft=7.5)
    assert quotas.limits(tenant) == quotas.Limits(max_concurrent_jobs=2, max_queued_jobs=3, gpu_hours_hard=None,
                                                  gpu_hours_soft=7.5)
    assert quotas.limits(Tenant(tier="gold")) == quotas.TIER_DEFAULTS["free"]  # unknown tier: the least
    assert quotas.limits(Tenant(tier="standard", max_queued_jobs=0)).max_queued_jobs == 0


def test_set_quota_checks_every_value_before_changing_any(world):
    _set_quota(world, "alpha", max_queued_jobs=5, gpu_hours_hard=quotas.UNLIMITED)
    for changes, param in [({"max_concurrent_jobs": 3, "gpu_hours_soft": -2.0}, "gpu_hours_soft"),
                           ({"max_queued_jobs": 2.5}, "max_queued_jobs"),
                           ({"gpu_hours_hard": float("nan")}, "gpu_hours_hard"),
                           ({"max_gpus": 4}, "max_gpus")]:
        with pytest.raises(ApiError) as info:
            _set_quota(world, "alpha", **changes)
        assert (info.value.status_code, info.value.param) == (400, param)
    with world.platform.db.session() as session:
        tenant = tenant_repo.by_name(session, "alpha")
        assert (tenant.max_concurrent_jobs, tenant.max_queued_jobs, tenant.gpu_hours_hard) == (None, 5, -1)
        assert quotas.limits(tenant) == quotas.Limits(4, 5, None, 300.0)
    _set_quota(world, "alpha", max_queued_jobs=None)  # back to the tier's default
    with world.platform.db.session() as session:
        assert quotas.limits(tenant_repo.by_name(session, "alpha")).max_queued_jobs == 20
    with pytest.raises(ApiError) as info:
        _set_quota(world, "nobody", max_queued_jobs=1)
    assert info.value.status_code == 404


# ---- admission ---------------------------------------------------------------------------
def test_free_tier_queue_limit_answers_429_and_creates_nothing(world):
    key_free = add_tenant(world.platform, "gamma", "free")
    training = _upload(world, key_free)
    created = [_create(world, key_free, training) for _ in range(3)]
    assert [r.status_code for r in created] == [200, 200, 200]
    refused = _create(world, key_free, training)
    assert refused.status_code == 429
    assert refused.json()["error"] == {
        "message": "Too many jobs waiting: 3 queued or validating, the limit is 3. "
                   "Retry once one of them has started, or cancel one.",
        "type": "rate_limit_error", "param": None, "code": "quota_exceeded"}
    with pytest.raises(openai.RateLimitError):
        world.sdk(key_free).fine_tuning.jobs.create(model=world.base_model, training_file=training)
    assert _jobs_of(world, "gamma") == 3
    assert _create(world, world.key_a, _upload(world, world.key_a)).status_code == 200  # others are not affected

    _set_status(world, created[0].json()["id"], "running")  # a running job no longer waits
    assert _create(world, key_free, training).status_code == 200
    assert _create(world, key_free, training).status_code == 429
    world.sdk(key_free).fine_tuning.jobs.cancel(created[1].json()["id"])
    assert _create(world, key_free, training).status_code == 200
    assert _jobs_of(world, "gamma") == 5


def test_queue_limit_override_applies_to_a_standard_tenant(world):
    _set_quota(world, "alpha", max_queued_jobs=1)
    training = _upload(world, world.key_a)
    assert _create(world, world.key_a, training).status_code == 200
    assert _create(world, world.key_a, training).json()["error"]["code"] == "quota_exceeded"
    _set_quota(world, "alpha", max_queued_jobs=quotas.UNLIMITED)
    assert _create(world, world.key_a, training).status_code == 200


def test_hard_cap_answers_403_on_billable_hours_of_this_month_only(world):
    _set_quota(world, "alpha", gpu_hours_hard=1.0)
    training = _upload(world, world.key_a)
    first = _create(world, world.key_a, training, **{"Idempotency-Key": "first"})
    assert first.status_code == 200
    _used(world, "alpha", 2.0, failure_class="platform")  # refunded: not counted
    last_month_start = usage.month_bounds(usage.current_month(_this_month_start() - 1))[0]
    _used(world, "alpha", 5.0, at=last_month_start)  # last month's
    _used(world, "alpha", 0.5)
    assert _create(world, world.key_a, training).status_code == 200
    _used(world, "alpha", 0.5)  # exactly at the cap: refused
    refused = _create(world, world.key_a, training)
    assert refused.status_code == 403
    error = refused.json()["error"]
    assert (error["code"], error["type"], error["param"]) == ("quota_exceeded", "insufficient_quota", None)
    assert "1.00 of 1 GPU-hours" in error["message"]
    with pytest.raises(openai.PermissionDeniedError):
        world.sdk(world.key_a).fine_tuning.jobs.create(model=world.base_model, training_file=training)
    assert _jobs_of(world, "alpha", "validating_files") + _jobs_of(world, "alpha", "queued") == 2
    replay = _create(world, world.key_a, training, **{"Idempotency-Key": "first"})  # a replay creates nothing
    assert replay.status_code == 200 and replay.json()["id"] == first.json()["id"]
    totals = world.http.get("/v1/usage", headers=world.headers(world.key_a)).json()["totals"]
    assert (totals["billable_gpu_hours"], totals["refunded_gpu_hours"]) == (1.0, 2.0)
    assert (totals["gpu_hours_hard"], totals["hard_cap_reached"]) == (1.0, True)
    assert _create(world, world.key_b, _upload(world, world.key_b)).status_code == 200  # beta has its own
    _set_quota(world, "alpha", gpu_hours_hard=quotas.UNLIMITED)
    assert _create(world, world.key_a, training).status_code == 200


def test_soft_allowance_is_flagged_not_enforced(world):
    key_free = add_tenant(world.platform, "gamma", "free")
    _used(world, "gamma", 6.0)  # free: soft 5, hard 10
    totals = world.http.get("/v1/usage", headers=world.headers(key_free)).json()["totals"]
    assert totals["billable_gpu_hours"] == 6.0
    assert (totals["gpu_hours_soft"], totals["gpu_hours_hard"]) == (5.0, 10.0)
    assert (totals["over_soft_allowance"], totals["hard_cap_reached"]) == (True, False)
    assert _create(world, key_free, _upload(world, key_free)).status_code == 200
    alpha = world.http.get("/v1/usage", headers=world.headers(world.key_a)).json()["totals"]
    assert alpha["over_soft_allowance"] is False


# ---- the scheduler's checks ---------------------------------------------------------------
def test_can_start_counts_running_and_evaluating_jobs_of_the_tenant_only(world):
    _set_quota(world, "alpha", max_concurrent_jobs=2)
    add_job(world.platform, "alpha", "queued")
    add_job(world.platform, "beta", "running")
    add_job(world.platform, "beta", "running")

    def can_start(name: str) -> bool:
        with world.platform.db.session() as session:
            return quotas.can_start(session, tenant_repo.by_name(session, name))

    assert can_start("alpha")
    add_job(world.platform, "alpha", "running")
    assert can_start("alpha")
    add_job(world.platform, "alpha", "evaluating")
    assert not can_start("alpha")
    assert can_start("beta")  # standard: 4
    with world.platform.db.session() as session:
        ids = {tenant_repo.by_name(session, name).tenant_id: name for name in ("alpha", "beta")}
        assert {ids[t]: n for t, n in quotas.running_counts(session).items()} == {"alpha": 2, "beta": 2}
    _set_quota(world, "alpha", max_concurrent_jobs=quotas.UNLIMITED)
    assert can_start("alpha")
    _set_quota(world, "beta", max_concurrent_jobs=0)  # a suspended tenant starts nothing
    assert not can_start("beta")


def test_hard_cap_reached_for_the_scheduler(world):
    _set_quota(world, "alpha", gpu_hours_hard=2.0)
    _used(world, "alpha", 1.5)
    with world.platform.db.session() as session:
        tenant = tenant_repo.by_name(session, "alpha")
        assert not quotas.hard_cap_reached(session, tenant)
        assert quotas.billable_gpu_hours(session, tenant, time.time()) == 1.5
    _used(world, "alpha", 0.5)
    with world.platform.db.session() as session:
        assert quotas.hard_cap_reached(session, tenant_repo.by_name(session, "alpha"))


def test_set_quota_cli(world):
    env = {"TUNEFORGE_HOME": str(world.platform.settings.home),
           "TUNEFORGE_DATABASE_URL": world.platform.settings.resolved_database_url, "COLUMNS": "200"}

    def cli(*args: str) -> Done:
        return run("tenants", "set-quota", *args, env=env)

    done = cli("alpha", "--max-concurrent-jobs", "2", "--gpu-hours-hard", "unlimited", "--gpu-hours-soft", "12.5")
    assert done.returncode == 0, done.stderr
    assert "max_concurrent_jobs 2, max_queued_jobs 20, gpu_hours_hard unlimited, gpu_hours_soft 12.5" in done.stderr
    with world.platform.db.session() as session:
        tenant = tenant_repo.by_name(session, "alpha")
        assert [getattr(tenant, f.name) for f in fields(quotas.Limits)] == [2, None, -1, 12.5]
    assert cli("alpha", "--gpu-hours-hard", "default").returncode == 0
    with world.platform.db.session() as session:
        assert quotas.limits(tenant_repo.by_name(session, "alpha")).gpu_hours_hard == 500.0
    bad = cli("alpha", "--max-queued-jobs", "many")
    assert bad.returncode == 2 and "--max-queued-jobs must be a number" in bad.stderr
    fractional = cli("alpha", "--max-queued-jobs", "2.5")
    assert fractional.returncode == 2 and "whole number" in fractional.stderr
