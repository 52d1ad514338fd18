"""Bursts against a running control plane: limits hold under concurrency and nothing answers 5xx."""

from __future__ import annotations

import asyncio
from collections import Counter

import httpx

from tests.helpers.net import free_port
from tests.helpers.platform import add_base_model, add_tenant, chat_lines, fake_model_dir
from tuneforge.db.migrate import upgrade
from tuneforge.db.repos import jobs as job_repo
from tuneforge.domain.status import JobStatus
from tuneforge.server import ControlPlane
from tuneforge.services import tenants as tenant_service
from tuneforge.settings import Settings

BURST = 100
CAP = 3


async def _burst(url: str, key: str, body: dict, count: int) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=count, max_keepalive_connections=count)
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"},
                                 timeout=120.0, limits=limits) as client:
        return await asyncio.gather(*(client.post("/v1/fine_tuning/jobs", json=body) for _ in range(count)))


def test_a_hundred_concurrent_creates_leave_exactly_the_queue_cap(tmp_path, database_url):
    settings = Settings(home=tmp_path / "home", database_url=database_url, port=free_port())
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
        assert {answer.json()["error"]["code"] for answer in refused} == {"too_many_queued_jobs"}
        with platform.db.session() as session:
            tenant_id = tenant_service.list_tenants(session)[0].tenant_id
            waiting = job_repo.with_status(session, [JobStatus.VALIDATING_FILES.value, JobStatus.QUEUED.value])
            assert len([job for job in waiting if job.tenant_id == tenant_id]) == CAP
        # the burst left the API answering another tenant at once
        assert httpx.get(f"{plane.url}/v1/fine_tuning/jobs",
                         headers={"Authorization": f"Bearer {other}"}).json()["data"] == []
    finally:
        plane.close()
