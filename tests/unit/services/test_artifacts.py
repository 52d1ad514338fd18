"""Partial artifacts follow the job's status (services/training/artifacts.py, registry/parents.py): a failed
job's checkpoints are not listed, downloaded, continued from or chatted with, and its weights are
removed from the store once its trainer is surely done; a running or succeeded job's are offered."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from tests.helpers.platform import add_base_model, add_tenant, fake_model_dir, make_platform
from tests.unit.api.test_usage import add_job
from tuneforge.api.app import create_app
from tuneforge.db.repos import tenants as tenant_repo
from tuneforge.db.tables import Checkpoint, Job
from tuneforge.registry import parents
from tuneforge.services.training import artifacts
from tuneforge.storage import layout

STEP = 10


@pytest.fixture
def world(tmp_path, database_url):
    platform = make_platform(tmp_path, database_url)
    add_base_model(platform, "tiny-base", fake_model_dir(tmp_path / "model"))
    http = TestClient(create_app(platform=platform), raise_server_exceptions=False)
    key = add_tenant(platform, "maker")
    yield platform, http, {"Authorization": f"Bearer {key}"}
    http.close()
    platform.db.dispose()


def _job_with_checkpoint(platform, status: str) -> tuple[str, str]:
    """A job of `status` with one adapter checkpoint (files and row) and final adapter files."""
    job_id = add_job(platform, "maker", status)
    with platform.db.session() as session:
        tenant_id = tenant_repo.by_name(session, "maker").tenant_id
        prefix = layout.checkpoint_prefix(tenant_id, job_id, STEP)
        for name in parents.ADAPTER_FILES:
            platform.store.put_bytes(f"{prefix}/{name}", b"{}")
        platform.store.put_bytes(f"{layout.artifact_prefix(tenant_id, job_id, 'adapter')}/adapter_config.json", b"{}")
        session.add(Checkpoint(checkpoint_id=f"ftckpt-{job_id[-8:]}", job_id=job_id, step=STEP, attempt=1,
                               prefix=prefix, metrics={}, created_at=int(time.time())))
        session.scalar(select(Job).where(Job.job_id == job_id)).finished_at = int(time.time()) - 3600
    return job_id, tenant_id


@pytest.mark.parametrize("status, offered", [("running", True), ("succeeded", True), ("paused", True),
                                             ("failed", False)])
def test_checkpoints_are_offered_only_for_jobs_that_did_not_fail(world, status, offered):
    platform, http, headers = world
    job_id, _tenant_id = _job_with_checkpoint(platform, status)
    listed = http.get(f"/v1/fine_tuning/jobs/{job_id}/checkpoints", headers=headers).json()["data"]
    assert len(listed) == (1 if offered else 0)
    download = http.get(f"/v1/fine_tuning/jobs/{job_id}/download", params={"step": STEP}, headers=headers)
    assert download.status_code == (200 if offered else 409), download.text
    if not offered:
        assert download.json()["error"]["code"] == "job_failed"
    with platform.db.session() as session:
        job = session.scalar(select(Job).where(Job.job_id == job_id))
        name = parents.checkpoint_name(job, "maker", STEP)
        assert (parents.find(session, job.tenant_id, "maker", name) is not None) == offered


def test_continuing_from_a_failed_job_s_checkpoint_is_refused(world):
    platform, http, headers = world
    job_id, _tenant_id = _job_with_checkpoint(platform, "failed")
    with platform.db.session() as session:
        name = parents.checkpoint_name(session.scalar(select(Job).where(Job.job_id == job_id)), "maker", STEP)
    answer = http.post("/v1/fine_tuning/jobs", headers=headers, json={"model": name, "training_file": "file-x"})
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "model_not_available"


def test_a_failed_job_s_weights_are_removed_after_the_grace(world):
    platform, _http, _headers = world
    failed, tenant_id = _job_with_checkpoint(platform, "failed")
    kept, _ = _job_with_checkpoint(platform, "succeeded")
    with platform.db.session() as session:
        assert artifacts.discard_failed(session, platform.store, time.time(), grace_s=7200) == 0  # too recent
    with platform.db.session() as session:
        assert artifacts.discard_failed(session, platform.store, time.time(), grace_s=600) == 1
    assert platform.store.list(layout.job_prefix(tenant_id, failed)) == []
    assert platform.store.list(layout.job_prefix(tenant_id, kept)) != []
    with platform.db.session() as session:
        rows = session.scalar(select(func.count()).select_from(Checkpoint).where(Checkpoint.job_id == failed))
        assert rows == 0
        assert artifacts.discard_failed(session, platform.store, time.time(), grace_s=600) == 0  # done once
