"""DELETE /v1/admin/tenants/{name}: an export first, then no object under the tenant's prefix and no
row of it but billing and audit; another tenant untouched; asking again changes nothing."""

from __future__ import annotations

import io
import json

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from tests.helpers.platform import chat_lines, make_platform
from tuneforge.api.app import create_app
from tuneforge.db.repos import tenant_data
from tuneforge.db.tables import Attempt, AuditRecord, Job, MeteredTokens, Tenant
from tuneforge.storage import layout

ADMIN = {"Authorization": "Bearer del-admin"}


@pytest.fixture
def plane(tmp_path, database_url):
    platform = make_platform(tmp_path, database_url, admin_api_key="del-admin")
    http = TestClient(create_app(platform=platform), raise_server_exceptions=False)
    yield platform, http
    http.close()
    platform.db.dispose()


def _tenant_with_data(platform, http: TestClient, name: str) -> tuple[str, dict[str, str]]:
    created = http.post("/v1/admin/tenants", json={"name": name}, headers=ADMIN).json()
    auth = {"Authorization": f"Bearer {created['api_key']}"}
    upload = http.post("/v1/files", files={"file": ("train.jsonl", io.BytesIO(chat_lines(12)))},
                       data={"purpose": "fine-tune"}, headers=auth)
    assert upload.status_code == 200, upload.text
    assert http.post("/v1/secrets", json={"name": "judge-key", "value": "sk-very-secret"},
                     headers=auth).status_code == 201
    platform.store.put_bytes(layout.results_key(created["id"], "ftjob-x"), b"step,loss\n1,2.0\n")
    with platform.db.session() as session:
        session.add(MeteredTokens(tenant_id=created["id"], kind="judge.served", model="m", requests=1,
                                  prompt_tokens=5, completion_tokens=7, created_at=1))
    return created["id"], auth


def test_deleting_a_tenant_leaves_only_billing_and_audit_and_spares_the_other(plane):
    platform, http = plane
    gone_id, gone_auth = _tenant_with_data(platform, http, "gone")
    kept_id, kept_auth = _tenant_with_data(platform, http, "kept")
    kept_objects = platform.store.list(layout.tenant_prefix(kept_id))
    with platform.db.session() as session:
        kept_rows = tenant_data.remaining(session, kept_id)
    assert platform.store.list(layout.tenant_prefix(gone_id)) and kept_objects

    answer = http.delete("/v1/admin/tenants/gone", headers=ADMIN)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["status"] == "deleted" and body["keys_revoked"] == 1 and body["objects_deleted"] >= 2
    assert body["rows_deleted"]["files"] == 1 and body["rows_deleted"]["tenant_secrets"] == 1

    # the export came first, outside the tenant's prefix, and holds no secret
    archive = json.loads(platform.store.get_bytes(body["export_key"]))
    assert body["export_key"].startswith("admin/tenant-exports/")
    assert [row["filename"] for row in archive["rows"]["files"]] == ["train.jsonl"]
    assert any(o["key"].endswith("results.csv") for o in archive["objects"])
    assert "sk-very-secret" not in json.dumps(archive) and "key_hash" not in json.dumps(archive)

    assert platform.store.list(layout.tenant_prefix(gone_id)) == []
    with platform.db.session() as session:
        assert set(tenant_data.remaining(session, gone_id).values()) == {0}
        tombstone = session.scalar(select(Tenant).where(Tenant.tenant_id == gone_id))
        assert tombstone.deleted_at and tombstone.purged_at
        assert session.scalar(select(func.count()).select_from(MeteredTokens)
                              .where(MeteredTokens.tenant_id == gone_id)) == 1
        assert tenant_data.remaining(session, kept_id) == kept_rows
        assert session.scalar(select(func.count()).select_from(AuditRecord)
                              .where(AuditRecord.tenant_id == gone_id)) >= 4
    assert platform.store.list(layout.tenant_prefix(kept_id)) == kept_objects
    assert http.get("/v1/files", headers=gone_auth).status_code == 401
    assert len(http.get("/v1/files", headers=kept_auth).json()["data"]) == 1

    again = http.delete("/v1/admin/tenants/gone", headers=ADMIN)
    assert again.status_code == 200 and again.json()["status"] == "deleted"
    assert again.json()["export_key"] == body["export_key"] and again.json()["objects_deleted"] == 0
    assert http.delete("/v1/admin/tenants/never", headers=ADMIN).status_code == 404
    audit = http.get("/v1/admin/audit", params={"tenant": "gone"}, headers=ADMIN).json()["data"]
    actions = [r["action"] for r in audit]
    assert actions.count("delete_tenant") == 2 and "tenant.export" in actions and "tenant.purge" in actions


def test_a_running_trainer_is_cancelled_and_the_purge_waits_for_it_to_stop(plane):
    from tests.helpers.platform import add_running_job
    from tuneforge.services.tenancy import deletion

    platform, http = plane
    _key, tenant_id, job_id = add_running_job(platform, "busy")
    with platform.db.session() as session:
        session.add(Attempt(job_id=job_id, number=1, status="running", token_hash="0" * 64, heartbeat_at=1.0,
                            started_at=1.0))
    platform.store.put_bytes(layout.results_key(tenant_id, job_id), b"x")
    body = http.delete("/v1/admin/tenants/busy", headers=ADMIN).json()
    assert body["status"] == "deleting" and body["jobs_cancelled"] == [job_id]
    assert platform.store.list(layout.tenant_prefix(tenant_id))  # the trainer may still write: nothing purged yet
    with platform.db.session() as session:
        job = session.scalar(select(Job).where(Job.job_id == job_id))
        assert job.status == "cancelled" and job.cancel_requested  # the scheduler signals the executor
        session.scalar(select(Attempt).where(Attempt.job_id == job_id)).status = "cancelled"
    assert deletion.finish_pending(platform.db.session, platform.store) == ["busy"]
    assert platform.store.list(layout.tenant_prefix(tenant_id)) == []
    assert http.delete("/v1/admin/tenants/busy", headers=ADMIN).json()["status"] == "deleted"
