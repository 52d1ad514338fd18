"""Bursts against a running control plane: limits hold under concurrency and nothing answers 5xx."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import httpx

from tests.e2e.test_restart import ServeProcess, serve_env
from tests.helpers.net import free_port, wait_until
from tests.helpers.platform import add_base_model, add_tenant, chat_lines, fake_model_dir, make_platform
from tuneforge.db.migrate import upgrade
from tuneforge.db.repos import jobs as job_repo
from tuneforge.domain.status import JobStatus
from tuneforge.server import ControlPlane
from tuneforge.services.tenancy import tenants as tenant_service
from tuneforge.settings import Settings

BURST = 100
CAP = 3
# The bursts are about the queue cap: the tiers' request limits (100/s, 64 in flight for standard)
# would answer some of them first (tests/unit/api/test_rate_limits.py covers those).
NO_RATE_LIMITS = {"free": None, "standard": None, "premium": None}


async def _burst(url: str, key: str, body: dict, count: int) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=count, max_keepalive_connections=count)
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"},
                                 timeout=120.0, limits=limits) as client:
        return await asyncio.gather(*(client.post("/v1/fine_tuning/jobs", json=body) for _ in range(count)))


def test_a_hundred_concurrent_creates_leave_exactly_the_queue_cap(tmp_path, database_url):
    settings = Settings(home=tmp_path / "home", database_url=database_url, port=free_port(),
                        rate_limits=NO_RATE_LIMITS)
    upgrade(settings.resolved_database_url)
    plane = ControlPlane(settings, run_scheduler=False, migrate=False).start_in_background()
    try:
        platform = plane.platform
        add_base_model(platform, "tiny-base", fake_model_dir(tmp_path / "model"))
        key = add_tenant(platform, "burst")
        other = add_tenant(platform, "bystander")
        with platform.db.session() as session:
            tenant_service.set_quota(session, "burst", {"max_queued_jobs": CAP})
        uploaded = httpx.post(f"{plane.url}/v1/files", headers={"Authorization": f"Bearer {key}"},
                              files={"file": ("train.jsonl", chat_lines(12))}, data={"purpose": "fine-tune"})
        assert uploaded.status_code == 200, uploaded.text
        body = {"model": "tiny-base", "training_file": uploaded.json()["id"]}

        answers = asyncio.run(_burst(plane.url, key, body, BURST))

        statuses = Counter(answer.status_code for answer in answers)
        assert statuses == {200: CAP, 429: BURST - CAP}, statuses
        refused = [answer for answer in answers if answer.status_code == 429]
        assert {answer.json()["error"]["code"] for answer in refused} == {"quota_exceeded"}
        with platform.db.session() as session:
            tenant_id = tenant_service.list_tenants(session)[0].tenant_id
            waiting = job_repo.with_status(session, [JobStatus.VALIDATING_FILES.value, JobStatus.QUEUED.value])
            assert len([job for job in waiting if job.tenant_id == tenant_id]) == CAP
        # the burst left the API answering another tenant at once
        assert httpx.get(f"{plane.url}/v1/fine_tuning/jobs",
                         headers={"Authorization": f"Bearer {other}"}).json()["data"] == []
    finally:
        plane.close()


def test_two_api_worker_processes_share_the_cap_and_one_scheduler(tmp_path, database_url):
    """`tuneforge serve` with two API workers: the burst lands on both processes, the cap still
    holds, the parent process is the only scheduler and the workers leave with it."""
    home = tmp_path / "home"
    port = free_port()
    env = serve_env(home, database_url, port, api_workers=2, local_gpus=0, rate_limits=json.dumps(NO_RATE_LIMITS))
    upgrade(database_url)
    platform = make_platform(tmp_path, database_url)
    try:
        add_base_model(platform, "tiny-base", fake_model_dir(tmp_path / "model"))
        key = add_tenant(platform, "burst")
        with platform.db.session() as session:
            tenant_service.set_quota(session, "burst", {"max_queued_jobs": CAP})
    finally:
        platform.db.dispose()
    plane = ServeProcess(env, port, tmp_path / "serve.log")
    plane.start()
    try:
        workers = _children(plane.proc.pid)
        assert len(workers) == 2, plane.log_tail()
        wait_until(lambda: httpx.get(f"{plane.url}/readyz", trust_env=False).status_code == 200, 60,
                   "the workers to see the scheduler's leader")
        uploaded = httpx.post(f"{plane.url}/v1/files", headers={"Authorization": f"Bearer {key}"},
                              files={"file": ("train.jsonl", chat_lines(12))}, data={"purpose": "fine-tune"})
        body = {"model": "tiny-base", "training_file": uploaded.json()["id"]}

        answers = asyncio.run(_burst(plane.url, key, body, BURST))

        statuses = Counter(answer.status_code for answer in answers)
        assert statuses == {200: CAP, 429: BURST - CAP}, (statuses, plane.log_tail())
        # the whole log: the jobs' validation (a tokenizer the fake model folder lacks) logs at length
        assert plane.log_path.read_text(errors="replace").count("now runs the scheduler") == 1
    finally:
        plane.kill()  # SIGKILL to the parent alone: its workers must not outlive it
    wait_until(lambda: not any(_alive(pid) for pid in workers), 30, "the API workers to exit with their parent")


def test_two_api_worker_processes_count_a_tenants_requests_together(tmp_path, database_url):
    """With two API workers the rate-limit counters are shared (HOME/ratelimit.db by default): a
    burst over both processes gets exactly the tier's requests of one window, not twice that."""
    home = tmp_path / "home"
    port = free_port()
    limits = {"standard": {"requests_per_s": 0.01, "window_s": 1000, "concurrent": None}}  # 10 per window
    env = serve_env(home, database_url, port, api_workers=2, local_gpus=0, rate_limits=json.dumps(limits))
    upgrade(database_url)
    platform = make_platform(tmp_path, database_url)
    try:
        key = add_tenant(platform, "burst")
    finally:
        platform.db.dispose()
    plane = ServeProcess(env, port, tmp_path / "serve.log")
    plane.start()
    try:
        assert len(_children(plane.proc.pid)) == 2, plane.log_tail()
        answers = asyncio.run(_gets(plane.url, key, 40))
        statuses = Counter(answer.status_code for answer in answers)
        assert statuses == {200: 10, 429: 30}, (statuses, plane.log_tail())
        refused = [answer for answer in answers if answer.status_code == 429]
        assert {answer.json()["error"]["code"] for answer in refused} == {"rate_limit_exceeded"}
        assert all(int(answer.headers["Retry-After"]) >= 1 for answer in refused)
        assert (home / "ratelimit.db").exists()
        # /metrics sums both workers' request counts (prometheus-client's multiprocess mode), whichever answers;
        # a request is counted once its answer is sent, so the last few may reach the files just after the client
        def scraped():  # noqa: ANN202
            return _request_counts(httpx.get(f"{plane.url}/metrics", trust_env=False).text, "GET")

        wait_until(lambda: sum(n for (_r, status), n in scraped().items() if status in ("200", "429")) >= 41, 15,
                   "every request of the burst to be counted")
        for _ in range(6):
            counts = _request_counts(httpx.get(f"{plane.url}/metrics", trust_env=False).text, "GET")
            assert counts.get(("/v1/files", "200")) == 10, counts
            assert sum(n for (_route, status), n in counts.items() if status == "429") == 30, counts
        assert list((home / "prometheus-multiproc").glob("*.db"))
    finally:
        plane.stop()


def _request_counts(text: str, method: str) -> dict[tuple[str, str], float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {(sample.labels["route"], sample.labels["status"]): sample.value
            for family in text_string_to_metric_families(text)
            if family.name == "tuneforge_http_request_duration_seconds"
            for sample in family.samples
            if sample.name.endswith("_count") and sample.labels["method"] == method}


async def _gets(url: str, key: str, count: int) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=count, max_keepalive_connections=count)
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"},
                                 timeout=120.0, limits=limits, trust_env=False) as client:
        return await asyncio.gather(*(client.get("/v1/files") for _ in range(count)))


def _children(pid: int) -> list[int]:
    """The API worker processes of `pid` (multiprocessing's resource tracker is a child too)."""
    with open(f"/proc/{pid}/task/{pid}/children") as handle:
        children = [int(child) for child in handle.read().split()]
    workers = []
    for child in children:
        with open(f"/proc/{child}/cmdline", "rb") as handle:
            if b"spawn_main" in handle.read():
                workers.append(child)
    return workers


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False
