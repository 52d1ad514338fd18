"""Per-tenant rate limits: 429 in OpenAI's envelope with Retry-After, per tenant and tier, requests in
flight, what is exempt, the openai SDK's own retry, limits off, and the setting's validation."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from pydantic import ValidationError

from tests.helpers.net import free_port
from tests.helpers.platform import add_running_job, add_tenant, make_platform
from tuneforge.api import deps
from tuneforge.api.app import create_app
from tuneforge.api.ratelimits import (
    Admission,
    RequestLimiter,
    default_storage_uri,
    duration,
    storage_uri,
    tier_policies,
)
from tuneforge.api.routes import admin, files, inference, internal, jobs, metrics, models, secrets, usage, webhooks
from tuneforge.db.ratelimit_storage import SqlStorage
from tuneforge.server import ControlPlane
from tuneforge.services.context import Platform
from tuneforge.services.datasets import files as file_service
from tuneforge.services.tenancy import tenants as tenant_service
from tuneforge.settings import Settings

ADMIN_KEY = "admin-key-for-rate-limit-tests"


class FakeClock:
    """Unix time that moves only when told, so windows end without waiting."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@dataclass
class Limited:
    platform: Platform
    http: TestClient
    limiter: RequestLimiter
    keys: dict[str, str]

    def get(self, name: str, path: str = "/v1/files"):
        return self.http.get(path, headers={"Authorization": f"Bearer {self.keys[name]}"})


@pytest.fixture
def limited(tmp_path, database_url):
    """An API whose limits a test sets: `build(rate_limits, tenants={name: tier}, clock=...)`. With a
    clock, counters live in a SQLite file that follows it (`across_network`: treated as a storage
    across the network); without one, in memory (the default)."""
    made: list[Limited] = []

    def build(rate_limits: dict, tenants: dict[str, str] | None = None, clock: FakeClock | None = None,
              across_network: bool = False, **overrides) -> Limited:
        platform = make_platform(tmp_path, database_url, rate_limits=rate_limits, admin_api_key=ADMIN_KEY,
                                 **overrides)
        if clock is None:
            limiter = RequestLimiter.from_settings(platform.settings)
        else:
            storage = SqlStorage(f"tuneforge+sqlite:///{tmp_path}/counters.db", clock=clock, wrap_exceptions=True)
            storage.local_file = not across_network  # as PostgreSQL or Redis would be: counted on a thread
            limiter = RequestLimiter(tier_policies(platform.settings), storage, clock=clock)
        keys = {name: add_tenant(platform, name, tier) for name, tier in (tenants or {"alpha": "standard"}).items()}
        world = Limited(platform, TestClient(create_app(platform=platform, rate_limiter=limiter),
                                             raise_server_exceptions=False), limiter, keys)
        made.append(world)
        return world

    yield build
    for world in made:
        world.http.close()
        world.limiter.close()
        world.platform.db.dispose()


def test_over_the_limit_answers_429_with_openais_envelope_and_retry_after(limited):
    clock = FakeClock()
    world = limited({"standard": {"requests_per_s": 3}}, clock=clock)
    answers = [world.get("alpha") for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert [a.headers["x-ratelimit-remaining-requests"] for a in answers] == ["2", "1", "0"]
    assert {a.headers["x-ratelimit-limit-requests"] for a in answers} == {"3"}
    assert {a.headers["x-ratelimit-reset-requests"] for a in answers} == {"1s"}

    clock.now += 0.25
    refused = world.get("alpha")
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert error["type"] == "requests" and error["code"] == "rate_limit_exceeded" and error["param"] is None
    assert "3 per second" in error["message"] and "standard" in error["message"] and "750ms" in error["message"]
    assert int(refused.headers["Retry-After"]) >= 1
    assert "x-ratelimit-remaining-requests" not in refused.headers

    clock.now += 0.75  # the window has ended: a new one starts with this request
    again = world.get("alpha")
    assert again.status_code == 200 and again.headers["x-ratelimit-remaining-requests"] == "2"


def test_a_tenant_over_its_rate_is_refused_at_the_door_until_its_window_ends(limited, monkeypatch):
    """Once a tenant is over its rate, the rest of its window is refused before routing: the same
    429 (envelope, Retry-After), no count in the storage, no dependency solved; the other tenant,
    other paths, a tier change and the next window are unaffected."""
    clock = FakeClock()
    world = limited({"standard": {"requests_per_s": 2}, "premium": None},
                    tenants={"alpha": "standard", "beta": "standard"}, clock=clock)
    assert [world.get("alpha").status_code for _ in range(3)] == [200, 200, 429]
    assert set(world.limiter.over_until) == {_tenant_id(world, "alpha")}

    counted: list[str] = []
    original_hit = world.limiter._hit
    monkeypatch.setattr(world.limiter, "_hit", lambda item, tenant_id: counted.append(tenant_id) or
                        original_hit(item, tenant_id))
    clock.now += 0.4
    for path in ("/v1/files", "/v1/fine_tuning/jobs", "/v1/fine_tuning/jobs/ftjob-x", "/v1/no-such-route"):
        refused = world.get("alpha", path)
        assert refused.status_code == 429, (path, refused.text)
        assert (refused.json()["error"]["code"] == "rate_limit_exceeded"
                and "600ms" in refused.json()["error"]["message"])
        assert refused.headers["Retry-After"] == "1" and refused.headers["X-Content-Type-Options"] == "nosniff"
    assert counted == []  # never reached the limiter's storage
    assert world.get("beta").status_code == 200 and counted == [_tenant_id(world, "beta")]
    assert world.http.get("/healthz", headers={"Authorization": f"Bearer {world.keys['alpha']}"}).status_code == 200

    with world.platform.db.session() as session:  # an upgrade to a tier without limits applies at once here
        tenant_service.set_tier(session, "alpha", "premium")
    world.platform.keys.forget()
    assert world.get("alpha").status_code == 200 and not world.limiter.over_until

    with world.platform.db.session() as session:
        tenant_service.set_tier(session, "alpha", "standard")
    world.platform.keys.forget()
    clock.now += 1.0  # a new window
    assert [world.get("alpha").status_code for _ in range(3)] == [200, 200, 429]
    clock.now += 1.0  # that one ended too: the door lets the tenant in again
    assert world.get("alpha").status_code == 200 and not world.limiter.over_until


def _tenant_id(world: Limited, name: str) -> str:
    with world.platform.db.session() as session:
        return next(t.tenant_id for t in tenant_service.list_tenants(session) if t.name == name)


def test_the_lean_job_routes_are_counted_and_release_their_slot(limited):
    clock = FakeClock()
    world = limited({"standard": {"requests_per_s": 4, "concurrent": 1}}, clock=clock)
    paths = ["/v1/fine_tuning/jobs", "/v1/fine_tuning/jobs/ftjob-none", "/v1/fine_tuning/jobs?limit=2",
             "/v1/fine_tuning/jobs/ftjob-other", "/v1/fine_tuning/jobs"]
    answers = [world.get("alpha", path) for path in paths]
    # one in flight at a time, one after another: each request's slot came back when it was answered
    assert [a.status_code for a in answers] == [200, 404, 200, 404, 429]
    assert [a.headers.get("x-ratelimit-remaining-requests") for a in answers[:4]] == ["3", "2", "1", "0"]
    assert answers[4].json()["error"]["code"] == "rate_limit_exceeded"
    assert world.limiter.in_flight.count("alpha") == 0
    assert world.http.get("/v1/fine_tuning/jobs").status_code == 401  # no key: refused before it is counted


def test_a_storage_across_the_network_is_counted_on_a_thread_never_on_the_event_loop(limited):
    clock = FakeClock()
    world = limited({"standard": {"requests_per_s": 2}}, clock=clock, across_network=True)
    assert not world.limiter.counts_on_loop
    threads: list[str] = []
    counted = world.limiter.storage.incr_with_expiry

    def recording(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return counted(*args, **kwargs)

    world.limiter.storage.incr_with_expiry = recording
    answers = [world.get("alpha") for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 429]
    assert answers[1].headers["x-ratelimit-remaining-requests"] == "0"
    assert len(threads) == 3 and all(name.startswith("AnyIO worker thread") for name in threads), threads


def test_a_longer_window_allows_a_burst_and_says_how_long_to_wait(limited):
    clock = FakeClock()
    world = limited({"standard": {"requests_per_s": 2, "window_s": 10}}, clock=clock)
    assert [world.get("alpha").status_code for _ in range(20)] == [200] * 20  # all at once
    clock.now += 4
    refused = world.get("alpha")
    assert refused.status_code == 429 and refused.headers["Retry-After"] == "6"
    assert "20 per 10 seconds" in refused.json()["error"]["message"]


def test_another_tenant_is_unaffected_while_one_floods(limited):
    clock = FakeClock()
    world = limited({"standard": {"requests_per_s": 5}}, {"alpha": "standard", "beta": "standard"}, clock=clock)
    flood = [world.get("alpha").status_code for _ in range(12)]
    assert flood.count(200) == 5 and flood.count(429) == 7
    assert [world.get("beta").status_code for _ in range(5)] == [200] * 5
    assert world.get("beta").status_code == 429  # beta has its own 5, no more


def test_each_tier_has_its_own_limits(limited):
    clock = FakeClock()
    world = limited({"free": {"requests_per_s": 1}, "standard": {"requests_per_s": 3}, "premium": None},
                    {"f": "free", "s": "standard", "p": "premium"}, clock=clock)
    assert [world.get("f").status_code for _ in range(3)] == [200, 429, 429]
    assert [world.get("s").status_code for _ in range(4)] == [200, 200, 200, 429]
    premium = [world.get("p") for _ in range(30)]
    assert {a.status_code for a in premium} == {200}
    assert "x-ratelimit-limit-requests" not in premium[0].headers


def test_exempt_health_admin_and_trainer_routes_and_unauthenticated_requests(limited):
    world = limited({"standard": {"requests_per_s": 0.001, "window_s": 1000}})  # 1 per 1000 s, in memory
    assert world.get("alpha").status_code == 200
    assert world.get("alpha").status_code == 429
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    assert {world.http.get("/healthz").status_code for _ in range(5)} == {200}
    assert {world.http.get("/v1/admin/tenants", headers=admin).status_code for _ in range(5)} == {200}
    # a trainer's report with a wrong job token fails its own check, never the tenants' limits
    report = world.http.post("/internal/v1/jobs/ftjob-x/heartbeat", json={"attempt": 1},
                             headers={"Authorization": "Bearer not-a-job-token"})
    assert report.status_code != 429
    # a request without a valid key is refused before it is counted
    assert world.http.get("/v1/files", headers={"Authorization": "Bearer tf-wrong"}).status_code == 401
    assert world.http.get("/v1/files").status_code == 401


def test_only_tenant_routes_go_through_the_limiter(limited):
    app = limited({}).http.app

    def uses_tenant(dependant) -> bool:  # noqa: ANN001 - a FastAPI Dependant
        return any(sub.call is deps.tenant or uses_tenant(sub) for sub in dependant.dependencies)

    def admits_itself(route: APIRoute) -> bool:  # a lean route (deps.admitted), documented by deps.lean_parameters
        return any(p["name"] == "authorization" for p in (route.openapi_extra or {}).get("parameters", ()))

    routers = (admin, files, inference, internal, jobs, metrics, models, secrets, usage, webhooks)
    routes = [r for router in routers for r in router.router.routes if isinstance(r, APIRoute)]
    routes += [r for r in app.routes if isinstance(r, APIRoute)]  # /healthz
    assert len(routes) > 40
    limited_paths = {r.path for r in routes if uses_tenant(r.dependant) or admits_itself(r)}
    assert {r.path for r in routes if admits_itself(r)} >= {"/v1/fine_tuning/jobs/{job_id}", "/v1/fine_tuning/jobs"}
    tenant_paths = {r.path for r in routes if r.path.startswith("/v1/") and not r.path.startswith("/v1/admin")}
    assert limited_paths == tenant_paths  # every tenant route; none of /internal, /v1/admin, /metrics, /healthz
    assert {"/v1/files", "/v1/fine_tuning/jobs", "/v1/chat/completions"} <= limited_paths
    # the reference documents the 429 on every tenant operation, not on the admin API
    document = app.openapi()
    assert "429" in document["paths"]["/v1/files"]["get"]["responses"]
    assert "429" not in document["paths"]["/v1/admin/tenants"]["get"]["responses"]


def test_the_openai_sdk_waits_retry_after_and_succeeds(limited, monkeypatch):
    clock = FakeClock()
    world = limited({"standard": {"requests_per_s": 1}}, clock=clock)
    # the SDK sleeps with time.sleep: here that moves the limiter's clock instead of waiting
    monkeypatch.setattr(time, "sleep", clock.sleep)
    statuses: list[int] = []
    world.http.event_hooks = {"request": [], "response": [lambda response: statuses.append(response.status_code)]}
    sdk = openai.OpenAI(base_url="http://testserver/v1", api_key=world.keys["alpha"], http_client=world.http,
                        max_retries=2)
    assert sdk.files.list().data == []
    assert sdk.files.list().data == []  # over the limit at first: the SDK retries on its own
    assert statuses == [200, 429, 200]
    assert clock.sleeps == [1.0]  # the Retry-After the 429 carried
    # without retries the SDK surfaces the 429 as its RateLimitError
    with pytest.raises(openai.RateLimitError) as raised:
        sdk.with_options(max_retries=0).files.list()
    assert raised.value.code == "rate_limit_exceeded" and raised.value.type == "requests"


def _block_list_files(monkeypatch) -> tuple[threading.Event, threading.Semaphore]:
    """GET /v1/files waits for `release`; `entered` counts requests that reached it."""
    release, entered = threading.Event(), threading.Semaphore(0)
    original = file_service.list_files

    def blocked(*args, **kwargs):
        entered.release()
        assert release.wait(timeout=60)
        return original(*args, **kwargs)

    monkeypatch.setattr(file_service, "list_files", blocked)
    return release, entered


def test_requests_in_flight_are_bounded_per_tenant(limited, monkeypatch):
    world = limited({"standard": {"concurrent": 2}}, {"alpha": "standard", "beta": "standard"})
    release, entered = _block_list_files(monkeypatch)
    answers: list[int] = []
    threads = [threading.Thread(target=lambda: answers.append(world.get("alpha").status_code)) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        for _ in threads:
            assert entered.acquire(timeout=60)
        assert world.limiter.in_flight.count(world_tenant_id(world, "alpha")) == 2
        refused = world.get("alpha", "/v1/fine_tuning/jobs")
        assert refused.status_code == 429 and refused.headers["Retry-After"] == "1"
        assert refused.json()["error"]["code"] == "concurrency_limit_exceeded"
        assert refused.json()["error"]["type"] == "requests"
        assert world.get("beta", "/v1/fine_tuning/jobs").status_code == 200  # its own bound
    finally:
        release.set()
        for thread in threads:
            thread.join(timeout=60)
    assert answers == [200, 200]
    assert world.limiter.in_flight.count(world_tenant_id(world, "alpha")) == 0
    assert world.get("alpha", "/v1/fine_tuning/jobs").status_code == 200


def test_a_request_that_fails_frees_its_slot(limited):
    world = limited({"standard": {"concurrent": 1}})
    for _ in range(3):  # each would be refused if the previous one had kept its slot
        assert world.get("alpha", "/v1/files/file-nope").status_code == 404
        assert world.get("alpha", "/v1/fine_tuning/jobs?limit=0").status_code == 400
    assert world.limiter.in_flight.count(world_tenant_id(world, "alpha")) == 0


def test_an_open_event_stream_gives_its_in_flight_slot_back(tmp_path, database_url):
    """Open event streams have their own bound and wait at no cost: one open stream must not keep
    a tenant allowed one request in flight from making another."""
    settings = Settings(home=tmp_path / "home", database_url=database_url, port=free_port(), stream_poll_s=3600,
                        rate_limits={"standard": {"concurrent": 1}})
    plane = ControlPlane(settings, run_scheduler=False).start_in_background()
    try:
        key, tenant_id, job_id = add_running_job(plane.platform, "alpha")
        auth = {"Authorization": f"Bearer {key}"}
        in_flight = plane.app.state.rate_limiter.in_flight

        async def scenario() -> None:
            async with httpx.AsyncClient(base_url=plane.url, timeout=30, trust_env=False) as client:
                url = f"/v1/fine_tuning/jobs/{job_id}/events?stream=true"
                async with client.stream("GET", url, headers=auth) as stream:
                    assert stream.status_code == 200  # open, and it stays open (the job runs)
                    assert in_flight.count(tenant_id) == 0
                    assert (await client.get("/v1/fine_tuning/jobs", headers=auth)).status_code == 200

        asyncio.run(scenario())
    finally:
        plane.close()


def test_an_abandoned_request_frees_its_slot():
    """The dependency holding the slot releases it when the request is cancelled (a client that
    went away) as when it ends normally."""
    limiter = RequestLimiter(tier_policies(Settings(rate_limits={"standard": {"concurrent": 1}})), None)

    async def run() -> int:
        held = deps.admission()
        slot = await held.__anext__()
        limiter.admit("tenant-1", "standard", slot)
        assert limiter.in_flight.count("tenant-1") == 1
        with pytest.raises(asyncio.CancelledError):
            await held.athrow(asyncio.CancelledError())
        return limiter.in_flight.count("tenant-1")

    assert asyncio.run(run()) == 0
    slot = Admission()
    limiter.admit("tenant-1", "standard", slot)
    slot.release()
    slot.release()  # a second release changes nothing
    assert limiter.in_flight.count("tenant-1") == 0


def world_tenant_id(world: Limited, name: str) -> str:
    from tuneforge.db.repos import tenants as tenant_repo

    with world.platform.db.session() as session:
        return tenant_repo.by_name(session, name).tenant_id


def test_limits_off_never_answer_429(limited):
    world = limited({"free": None, "standard": {"requests_per_s": 0, "concurrent": 0}, "premium": None},
                    {"alpha": "standard", "gamma": "free"})
    assert world.limiter.storage is None  # nothing to count: no storage at all
    answers = [world.get(name) for _ in range(150) for name in ("alpha", "gamma")]
    assert {a.status_code for a in answers} == {200}
    assert not any("x-ratelimit-limit-requests" in a.headers for a in answers)


def test_defaults_let_normal_use_through(limited):
    world = limited({})
    assert world.platform.settings.rate_limits["standard"].requests_per_s == 100
    assert world.limiter.storage.__class__.__name__ == "MemoryStorage" and world.limiter.counts_on_loop
    answers = [world.get("alpha") for _ in range(30)]
    assert {a.status_code for a in answers} == {200}
    assert answers[0].headers["x-ratelimit-limit-requests"] == "100"
    # a route that answers with its own Response object carries them too
    jobs = world.get("alpha", "/v1/fine_tuning/jobs")
    assert jobs.status_code == 200
    # 31 requests so far: 69 left, unless a slow machine took over a second and the window turned
    # (the exact counts are checked on a fake clock above)
    assert 69 <= int(jobs.headers["x-ratelimit-remaining-requests"]) <= 99


def test_a_failing_storage_lets_requests_through(limited, tmp_path):
    clock = FakeClock()
    world = limited({"standard": {"requests_per_s": 1}}, clock=clock)
    assert world.get("alpha").status_code == 200
    assert world.get("alpha").status_code == 429
    import sqlite3

    with sqlite3.connect(tmp_path / "counters.db") as conn:
        conn.execute("DROP TABLE rate_limit_counters")
    clock.now += 1.0  # the window it was over in has ended (until then the door refuses it, storage or not)
    assert [world.get("alpha").status_code for _ in range(3)] == [200, 200, 200]


# ---- the setting ---------------------------------------------------------------------------------

def test_the_setting_merges_over_the_defaults_and_reads_json_from_the_environment(monkeypatch):
    monkeypatch.setenv("TUNEFORGE_RATE_LIMITS", '{"free": {"requests_per_s": 5}, "premium": null}')
    settings = Settings()
    free = settings.rate_limits["free"]
    assert (free.requests_per_s, free.window_s, free.concurrent) == (5, 1, 16)
    assert settings.rate_limits["standard"].requests_per_s == 100
    assert settings.rate_limits["premium"] is None
    policies = tier_policies(settings)
    assert policies["free"].item.amount == 5 and policies["premium"].item is None


@pytest.mark.parametrize(("value", "named"), [
    ({"gold": {"requests_per_s": 5}}, "gold"),
    ({"free": {"requests_per_s": -1}}, "requests_per_s"),
    ({"free": {"requests_per_s": 0.5}}, "whole number"),  # 0.5 per 1 s window
    ({"free": {"window_s": 0}}, "window_s"),
    ({"free": {"concurrent": 2.5}}, "concurrent"),
    ({"free": {"burst": 10}}, "burst"),
    ({"free": 20}, "free"),
])
def test_a_bad_setting_stops_the_start_naming_the_problem(value, named):
    with pytest.raises(ValidationError) as raised:
        Settings(rate_limits=value)
    assert named in str(raised.value)


def test_a_fractional_rate_over_a_longer_window_is_fine():
    settings = Settings(rate_limits={"free": {"requests_per_s": 0.5, "window_s": 10}})
    assert tier_policies(settings)["free"].item.amount == 5


@pytest.mark.parametrize("uri", ["nosuch://x", "async+memory://", "tuneforge+sqlite://", "database2"])
def test_an_unknown_storage_stops_the_start(uri):
    with pytest.raises(ValidationError) as raised:
        Settings(rate_limit_storage=uri)
    assert "TUNEFORGE_RATE_LIMIT_STORAGE" in str(raised.value)


def test_storage_defaults_follow_the_number_of_api_workers(tmp_path):
    settings = Settings(home=tmp_path)
    assert default_storage_uri(settings, 1) == storage_uri(settings) == "memory://"
    shared = f"tuneforge+sqlite:///{(tmp_path / 'ratelimit.db').resolve()}"
    assert default_storage_uri(settings, 4) == storage_uri(settings, 4) == shared
    # 'database' on SQLite: a file of its own beside the platform's database, never that database
    assert storage_uri(Settings(home=tmp_path, rate_limit_storage="database")) == shared
    on_postgres = Settings(home=tmp_path, rate_limit_storage="database",
                           database_url="postgresql+psycopg://tf:pw@db:5432/tuneforge")
    assert storage_uri(on_postgres) == "tuneforge+postgresql://tf:pw@db:5432/tuneforge"
    assert storage_uri(Settings(rate_limit_storage="redis://cache:6379")) == "redis://cache:6379"


def test_several_workers_share_the_in_flight_bound_and_one_counter_file(tmp_path):
    limiter = RequestLimiter.from_settings(Settings(home=tmp_path), workers=3)
    try:
        assert {tier: p.in_flight for tier, p in limiter.policies.items()} == {
            "free": 6, "standard": 22, "premium": 86}  # 16, 64, 256 over 3, rounded up
        assert isinstance(limiter.storage, SqlStorage)
        assert (Path(tmp_path) / "ratelimit.db").exists()
        assert limiter.counts_on_loop  # a local file: no trip to a thread
    finally:
        limiter.close()


def test_reset_durations_read_like_openais():
    assert [duration(s) for s in (0, 0.25, 0.9996, 1, 1.5, 60, 75.25)] == [
        "0ms", "250ms", "1s", "1s", "1.5s", "1m0s", "1m15.25s"]
