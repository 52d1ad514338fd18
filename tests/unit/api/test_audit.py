"""The audit log: every mutating request with its caller and request id, the admin route that reads
it, and rows nobody can change."""

from __future__ import annotations

import io

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from tests.helpers.platform import chat_lines, make_platform
from tuneforge.api.app import create_app

ADMIN = {"Authorization": "Bearer audit-admin"}


@pytest.fixture
def plane(tmp_path, database_url):
    platform = make_platform(tmp_path, database_url, admin_api_key="audit-admin")
    http = TestClient(create_app(platform=platform), raise_server_exceptions=False)
    yield platform, http
    http.close()
    platform.db.dispose()


def _audit(http: TestClient, **params) -> list[dict]:
    answer = http.get("/v1/admin/audit", params=params, headers=ADMIN)
    assert answer.status_code == 200, answer.text
    return answer.json()["data"]


def test_mutations_are_recorded_with_caller_resource_and_request_id(plane):
    platform, http = plane
    created = http.post("/v1/admin/tenants", json={"name": "acme"}, headers=ADMIN).json()
    tenant_id, key = created["id"], created["api_key"]
    auth = {"Authorization": f"Bearer {key}"}
    upload = http.post("/v1/files", files={"file": ("train.jsonl", io.BytesIO(chat_lines(12)))},
                       data={"purpose": "fine-tune"}, headers=auth)
    assert upload.status_code == 200, upload.text
    file_id = upload.json()["id"]
    deleted = http.delete(f"/v1/files/{file_id}", headers=auth)
    assert deleted.status_code == 200
    assert http.delete("/v1/files/file-nope", headers=auth).status_code == 404
    # refused credentials and reads change nothing: not recorded
    assert http.delete(f"/v1/files/{file_id}", headers={"Authorization": "Bearer tf-wrong"}).status_code == 401
    http.get("/v1/files", headers=auth)

    rows = _audit(http, tenant="acme")
    assert [(r["actor"], r["action"], r["resource_type"], r["resource_id"], r["status_code"]) for r in rows] == [
        ("admin", "create_tenant", "tenants", tenant_id, 200),
        ("tenant", "create_file", "files", file_id, 200),
        ("tenant", "delete_file", "files", file_id, 200),
        ("tenant", "delete_file", "files", "file-nope", 404),
    ]
    assert all(r["tenant_id"] == tenant_id for r in rows)
    key_rows = [r for r in rows if r["actor"] == "tenant"]
    assert key_rows[0]["key_id"] and key_rows[0]["key_id"] == key_rows[1]["key_id"]
    assert deleted.headers["X-Request-Id"] == rows[2]["request_id"]
    assert len({r["request_id"] for r in rows}) == 4
    # no secret reaches the log: neither the key nor the body
    everything = http.get("/v1/admin/audit", headers=ADMIN).text
    assert key not in everything and "code-1" not in everything
    # filters and pages
    assert [r["action"] for r in _audit(http, resource_id=file_id)] == ["create_file", "delete_file"]
    assert [r["resource_id"] for r in _audit(http, action="delete_file")] == [file_id, "file-nope"]
    first = http.get("/v1/admin/audit", params={"limit": 2}, headers=ADMIN).json()
    assert first["has_more"] and len(first["data"]) == 2
    rest = _audit(http, after=first["last_id"])
    assert [r["id"] for r in first["data"] + rest] == [r["id"] for r in rows]
    # the operator's own key only
    assert http.get("/v1/admin/audit", headers=auth).status_code == 401


def test_audit_rows_cannot_be_changed_on_postgresql(plane, db_backend):
    platform, http = plane
    http.post("/v1/admin/tenants", json={"name": "acme"}, headers=ADMIN)
    if db_backend != "postgresql":
        pytest.skip("SQLite has no triggers of ours; the repository has no update or delete")
    for statement in ("UPDATE audit_log SET actor = 'x'", "DELETE FROM audit_log", "TRUNCATE audit_log"):
        with pytest.raises(Exception, match="append-only"), platform.db.session() as session:
            session.execute(text(statement))
    assert len(_audit(http)) == 1


def test_an_admins_move_of_a_tenants_model_is_recorded_under_that_tenant(plane):
    from tests.helpers.platform import add_finished_job

    platform, http = plane
    _key, model_id = add_finished_job(platform, "owner")
    moved = http.post(f"/v1/admin/models/{model_id}/promote", json={"stage": "dev"}, headers=ADMIN)
    assert moved.status_code == 200, moved.text
    [row] = _audit(http, tenant="owner")
    assert (row["actor"], row["action"], row["resource_type"], row["resource_id"]) == (
        "admin", "promote_model", "models", model_id)
