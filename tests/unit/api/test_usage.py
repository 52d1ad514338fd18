"""Metering: GPU-seconds from constructed attempt rows, refunds, months, tenant isolation."""

from __future__ import annotations

import time

import pytest

from tests.helpers.cli import run
from tuneforge.db.repos import tenants as tenant_repo
from tuneforge.db.tables import Attempt, Job
from tuneforge.domain.ids import new_id
from tuneforge.domain.job_config import JobRequest
from tuneforge.services.context import Platform
from tuneforge.services.tenancy import tenants as tenant_service
from tuneforge.services.tenancy import usage

MARCH = "2025-03"
M0, M1 = usage.month_bounds(MARCH)  # 2025-03-01T00:00Z, 2025-04-01T00:00Z


def add_job(platform: Platform, tenant: str, status: str = "succeeded", *, created_at: float | None = None,
            model: str = "tiny-base") -> str:
    """A job row as the scheduler would leave it (no files or validation needed for metering)."""
    with platform.db.session() as session:
        row = tenant_repo.by_name(session, tenant)
        job = Job(job_id=new_id("ftjob"), tenant_id=row.tenant_id, model=model, base_model_sha256="0" * 64,
                  training_file="file-x", status=status, attempt=0, seed=1,
                  request=JobRequest(model=model, training_file="file-x"), result_files=[],
                  request_hash="0" * 64, created_at=int(created_at if created_at is not None else time.time()))
        session.add(job)
        return job.job_id


def add_attempt(platform: Platform, job_id: str, number: int, *, started_at: float, ended_at: float | None,
                gpus: int = 1, status: str = "succeeded", failure_class: str | None = None,
                price: tuple[float, float] | None = None) -> None:
    """`price`: (per GPU-hour where it ran, per GPU-hour on demand), as a launch records them."""
    placement = None if price is None else {"node": "n", "gpu_ids": [], "pool": "p", "price_per_gpu_hour": price[0],
                                            "on_demand_price_per_gpu_hour": price[1]}
    with platform.db.session() as session:
        session.add(Attempt(job_id=job_id, number=number, status=status, token_hash="0" * 64, gpus=gpus,
                            heartbeat_at=ended_at or started_at, started_at=started_at, ended_at=ended_at,
                            failure_class=failure_class, placement=placement))


def march_history(platform: Platform) -> dict[str, str]:
    """alpha's March 2025: 6300 billable and 900 refunded GPU-seconds (2.0 GPU-hours in all)."""
    retried = add_job(platform, "alpha")
    add_attempt(platform, retried, 1, started_at=M0 + 100, ended_at=M0 + 450, gpus=2, status="failed",
                failure_class="platform", price=(1.8, 3.6))  # crashed: 700 GPU-s refunded
    add_attempt(platform, retried, 2, started_at=M0 + 500, ended_at=M0 + 1500, gpus=2, status="preempted",
                failure_class="preempted", price=(1.8, 3.6))  # 2000 GPU-s billed on spot: checkpointed
    add_attempt(platform, retried, 3, started_at=M0 + 1600, ended_at=M0 + 2600, gpus=2,
                price=(3.6, 3.6))  # 2000 billed on demand
    lost = add_job(platform, "alpha", "failed")
    add_attempt(platform, lost, 1, started_at=M0 + 100, ended_at=M0 + 300, status="lost")  # 200 refunded
    spanning = add_job(platform, "alpha")
    add_attempt(platform, spanning, 1, started_at=M0 - 1000, ended_at=M0 + 500, gpus=4)  # 2000 in March
    bad_data = add_job(platform, "alpha", "failed")
    add_attempt(platform, bad_data, 1, started_at=M0 + 7000, ended_at=M0 + 7300, status="failed",
                failure_class="user")  # 300 billed: the tenant's data failed
    other = add_job(platform, "beta")
    add_attempt(platform, other, 1, started_at=M0 + 10, ended_at=M0 + 10_010, gpus=8)
    queued_only = add_job(platform, "alpha", "queued")  # never ran: no usage
    return {"retried": retried, "lost": lost, "spanning": spanning, "bad_data": bad_data, "other": other,
            "queued_only": queued_only}


def test_usage_sums_exact_gpu_seconds_refunds_platform_failures_and_hides_other_tenants(world):
    jobs = march_history(world.platform)
    response = world.http.get("/v1/usage", params={"month": MARCH}, headers=world.headers(world.key_a))
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "list"
    by_id = {row["job_id"]: row for row in body["data"]}
    assert list(by_id) == [jobs["bad_data"], jobs["spanning"], jobs["lost"], jobs["retried"]]  # newest first
    assert by_id[jobs["retried"]] == {
        "object": "usage.job", "job_id": jobs["retried"], "model": "tiny-base", "status": "succeeded",
        "gpu_seconds": 4700.0, "billable_gpu_seconds": 4000.0, "refunded_gpu_seconds": 700.0, "attempts": 3,
        # each attempt at its pool's price: 2000 GPU-s at 1.8/h and 2000 at 3.6/h; the refunded one costs nothing
        "cost": 3.0, "on_demand_cost": 4.0, "saving": 1.0}
    assert (by_id[jobs["lost"]]["billable_gpu_seconds"], by_id[jobs["lost"]]["refunded_gpu_seconds"]) == (0.0, 200.0)
    assert by_id[jobs["spanning"]]["gpu_seconds"] == 2000.0  # the February part is February's
    assert by_id[jobs["bad_data"]]["billable_gpu_seconds"] == 300.0
    assert body["totals"] == {
        "month": MARCH, "gpu_hours": 2.0, "billable_gpu_hours": 1.75, "refunded_gpu_hours": 0.25,
        "gpu_hours_soft": 300.0, "gpu_hours_hard": 500.0, "over_soft_allowance": False, "hard_cap_reached": False}
    beta = world.http.get("/v1/usage", params={"month": MARCH}, headers=world.headers(world.key_b)).json()
    assert [row["job_id"] for row in beta["data"]] == [jobs["other"]]
    assert beta["totals"]["billable_gpu_hours"] == pytest.approx(80_000 / 3600, abs=1e-6)


def test_month_filter_splits_an_attempt_at_the_month_boundary(world):
    jobs = march_history(world.platform)
    february = world.http.get("/v1/usage", params={"month": "2025-02"}, headers=world.headers(world.key_a)).json()
    assert [(r["job_id"], r["gpu_seconds"], r["attempts"]) for r in february["data"]] == [(jobs["spanning"], 4000.0, 1)]
    assert february["totals"]["month"] == "2025-02"
    assert february["totals"]["billable_gpu_hours"] == pytest.approx(4000 / 3600, abs=1e-6)
    april = world.http.get("/v1/usage", params={"month": "2025-04"}, headers=world.headers(world.key_a)).json()
    assert april["data"] == [] and april["totals"]["gpu_hours"] == 0.0


@pytest.mark.parametrize("month", ["2025-13", "2025-3", "march", "1969-12", "2025-03-01"])
def test_bad_month_is_400_naming_the_param(world, month):
    response = world.http.get("/v1/usage", params={"month": month}, headers=world.headers(world.key_a))
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "month"
    assert response.json()["error"]["code"] == "invalid_value"


def test_usage_needs_an_api_key(world):
    response = world.http.get("/v1/usage")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "missing_api_key"


def test_a_running_attempt_counts_up_to_now(world):
    now = time.time()
    month_start, _end = usage.month_bounds(usage.current_month(now))
    job_id = add_job(world.platform, "alpha", "running")
    started = max(month_start, now - 100)
    add_attempt(world.platform, job_id, 1, started_at=started, ended_at=None, gpus=2, status="running")
    body = world.http.get("/v1/usage", headers=world.headers(world.key_a)).json()
    assert body["totals"]["month"] == usage.current_month(now)
    [row] = body["data"]
    assert row["status"] == "running"
    assert row["billable_gpu_seconds"] == pytest.approx(2 * (time.time() - started), abs=10)
    with world.platform.db.session() as session:  # at a fixed clock, exact
        tenant_id = tenant_repo.by_name(session, "alpha").tenant_id
        [metered] = usage.jobs_usage(session, tenant_id, usage.current_month(now), started + 37.5)
    assert metered.metered.billable_gpu_seconds == 75.0


def test_metering_is_computed_not_accumulated_so_it_never_counts_twice(world):
    march_history(world.platform)
    with world.platform.db.session() as session:
        tenant_id = tenant_repo.by_name(session, "alpha").tenant_id
        first = usage.tenant_usage(session, tenant_id, M0, M1, now=M1 + 10)
        again = usage.tenant_usage(session, tenant_id, M0, M1, now=M1 + 99_999)
    assert (first.billable_gpu_seconds, first.refunded_gpu_seconds, first.attempts) == (6300.0, 900.0, 6)
    assert (again.billable_gpu_seconds, again.refunded_gpu_seconds) == (6300.0, 900.0)  # ended attempts stay put


def test_attempt_closed_without_end_time_is_metered_to_its_last_heartbeat(world):
    job_id = add_job(world.platform, "alpha", "failed")
    with world.platform.db.session() as session:
        session.add(Attempt(job_id=job_id, number=1, status="cancelled", token_hash="0" * 64, gpus=3,
                            heartbeat_at=M0 + 40, started_at=M0 + 10, ended_at=None))
    with world.platform.db.session() as session:
        tenant_id = tenant_repo.by_name(session, "alpha").tenant_id
        metered = usage.tenant_usage(session, tenant_id, M0, M1, now=M1)
    assert metered.billable_gpu_seconds == 90.0


def test_month_helpers():
    assert usage.month_bounds("2026-12") == (1796083200.0, 1798761600.0)  # December ends at the new year
    assert usage.current_month(1796083200.0) == "2026-12"
    assert usage.current_month(1796083199.0) == "2026-11"
    assert usage.parse_month(" 2026-11 ") == "2026-11"


def test_admin_usage_report_lists_every_tenant(world):
    march_history(world.platform)
    with world.platform.db.session() as session:
        rows = {row["tenant"]: row for row in tenant_service.usage_report(session, MARCH, now=M1)}
    assert set(rows) == {"alpha", "beta"}
    assert (rows["alpha"]["billable_gpu_hours"], rows["alpha"]["refunded_gpu_hours"]) == (1.75, 0.25)
    assert rows["beta"]["gpu_hours"] == pytest.approx(80_000 / 3600, abs=1e-6)
    assert rows["beta"]["over_soft_allowance"] is False  # 22.2 h of standard's 300


def test_usage_cli_prints_per_tenant_totals(world, tmp_path):
    march_history(world.platform)
    env = {"TUNEFORGE_HOME": str(world.platform.settings.home),
           "TUNEFORGE_DATABASE_URL": world.platform.settings.resolved_database_url, "COLUMNS": "200"}
    done = run("tenants", "usage", "--month", MARCH, env=env)
    assert done.returncode == 0, done.stderr
    lines = {line.split()[1]: line.split() for line in done.stdout.splitlines() if line.startswith("│ ")}
    assert [cell for cell in lines["alpha"] if cell != "│"] == ["alpha", "standard", "2.00", "1.75", "0.25",
                                                                "300", "no", "500"]
    assert [cell for cell in lines["beta"] if cell != "│"] == ["beta", "standard", "22.22", "22.22", "0.00",
                                                               "300", "no", "500"]
    refused = run("tenants", "usage", "--month", "2025-13", env=env)
    assert refused.returncode == 2 and "YYYY-MM" in refused.stderr
