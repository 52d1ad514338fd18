"""The admin API: off without a key, 401 with a wrong one; tenants, tiers, quotas, usage, queue."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.helpers.platform import make_platform
from tuneforge.api.app import create_app


def test_admin_api_is_off_without_a_key(tmp_path, database_url):
    platform = make_platform(tmp_path, database_url)
    http = TestClient(create_app(platform=platform))
    response = http.get("/v1/admin/tenants", headers={"Authorization": "Bearer anything"})
    assert response.status_code == 404 and "TUNEFORGE_ADMIN_API_KEY" in response.json()["error"]["message"]
    platform.db.dispose()


def test_admin_manages_tenants_tiers_and_quotas(tmp_path, database_url):
    platform = make_platform(tmp_path, database_url, admin_api_key="s3cret-admin")
    http = TestClient(create_app(platform=platform))
    admin = {"Authorization": "Bearer s3cret-admin"}
    assert http.get("/v1/admin/tenants", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert http.get("/v1/admin/tenants").status_code == 401

    created = http.post("/v1/admin/tenants", json={"name": "acme", "tier": "free"}, headers=admin)
    assert created.status_code == 200, created.text
    body = created.json()
    assert body["tier"] == "free" and body["api_key"].startswith("tf-")
    assert body["quotas"]["max_concurrent_jobs"] == 1  # the free tier's default
    # the new key works on the tenant API and not on the admin API
    tenant_auth = {"Authorization": f"Bearer {body['api_key']}"}
    assert http.get("/v1/fine_tuning/jobs", headers=tenant_auth).status_code == 200
    assert http.get("/v1/admin/tenants", headers=tenant_auth).status_code == 401

    tier = http.post("/v1/admin/tenants/acme/tier", json={"tier": "premium"}, headers=admin).json()
    assert tier["tier"] == "premium" and tier["quotas"]["gpu_hours_hard"] is None
    quota = http.post("/v1/admin/tenants/acme/quota", json={"max_concurrent_jobs": 2, "gpu_hours_hard": "unlimited"},
                      headers=admin).json()
    assert quota["quotas"]["max_concurrent_jobs"] == 2 and quota["quotas"]["gpu_hours_hard"] is None
    back = http.post("/v1/admin/tenants/acme/quota", json={"max_concurrent_jobs": "default"}, headers=admin).json()
    assert back["quotas"]["max_concurrent_jobs"] == 16  # premium default again
    bad = http.post("/v1/admin/tenants/acme/quota", json={"max_queued_jobs": -5}, headers=admin)
    assert bad.status_code == 400
    assert http.post("/v1/admin/tenants/acme/tier", json={"tier": "gold"}, headers=admin).status_code == 400
    assert http.post("/v1/admin/tenants/nobody/tier", json={"tier": "free"}, headers=admin).status_code == 404

    names = [t["name"] for t in http.get("/v1/admin/tenants", headers=admin).json()["data"]]
    assert names == ["acme"]
    usage = http.get("/v1/admin/usage", headers=admin).json()
    assert [row["tenant"] for row in usage["data"]] == ["acme"]
    assert http.get("/v1/admin/queue", headers=admin).json()["data"] == []
    platform.db.dispose()
