"""API key lifecycle through the admin API: more keys per tenant, expiry, revocation, last use."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from tests.helpers.platform import add_tenant, make_platform
from tuneforge.api.app import create_app
from tuneforge.db.repos import tenants as tenant_repo
from tuneforge.domain.errors import ApiError
from tuneforge.services.tenancy import api_keys
from tuneforge.services.tenancy import tenants as tenant_service

ADMIN = {"Authorization": "Bearer s3cret-admin"}


@pytest.fixture
def http(tmp_path, database_url):
    platform = make_platform(tmp_path, database_url, admin_api_key="s3cret-admin")
    add_tenant(platform, "alpha")
    add_tenant(platform, "beta")
    client = TestClient(create_app(platform=platform), raise_server_exceptions=False)
    client.platform = platform
    yield client
    client.close()
    platform.db.dispose()


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _jobs(http: TestClient, key: str):
    return http.get("/v1/fine_tuning/jobs", headers=_bearer(key))


def test_a_second_key_works_and_revoking_one_leaves_the_other(http):
    first = http.post("/v1/admin/tenants/alpha/keys", json={"name": "ci"}, headers=ADMIN)
    second = http.post("/v1/admin/tenants/alpha/keys", headers=ADMIN)  # no body at all
    assert first.status_code == 200 and second.status_code == 200, (first.text, second.text)
    one, two = first.json(), second.json()
    assert one["api_key"].startswith("tf-") and one["id"].startswith("key-") and one["name"] == "ci"
    assert one["prefix"] == one["api_key"][:10] and one["expires_at"] is None and one["created_at"] > 0
    assert _jobs(http, one["api_key"]).status_code == 200
    assert _jobs(http, two["api_key"]).status_code == 200

    revoked = http.delete(f"/v1/admin/tenants/alpha/keys/{one['id']}", headers=ADMIN)
    assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
    refused = _jobs(http, one["api_key"])
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "invalid_api_key"
    assert _jobs(http, two["api_key"]).status_code == 200
    # revoking again changes nothing
    again = http.delete(f"/v1/admin/tenants/alpha/keys/{one['id']}", headers=ADMIN)
    assert again.status_code == 200 and again.json()["revoked_at"] == revoked.json()["revoked_at"]


def test_refusals_of_unknown_revoked_and_expired_keys_look_alike(http):
    created = http.post("/v1/admin/tenants/alpha/keys", json={"expires_in_s": 3600}, headers=ADMIN).json()
    assert created["expires_at"] >= int(time.time()) + 3590
    revoked = http.post("/v1/admin/tenants/alpha/keys", headers=ADMIN).json()
    http.delete(f"/v1/admin/tenants/alpha/keys/{revoked['id']}", headers=ADMIN)
    with http.platform.db.session() as session:  # let the first key's hour pass
        key = tenant_repo.key_of(session, tenant_repo.by_name(session, "alpha").tenant_id, created["id"])
        key.expires_at = int(time.time()) - 1
    answers = [_jobs(http, key) for key in (created["api_key"], revoked["api_key"], "tf-never-issued")]
    assert {a.status_code for a in answers} == {401}
    assert len({a.text for a in answers}) == 1


def test_an_expiring_key_works_until_it_expires(http):
    with http.platform.db.session() as session:
        key, secret = tenant_service.create_key(session, "alpha", expires_in_s=10, now=1000.0)
        assert key.expires_at == 1010
        assert api_keys.authenticate(session, f"Bearer {secret}", now=1009.0).name == "alpha"
        with pytest.raises(ApiError) as refused:
            api_keys.authenticate(session, f"Bearer {secret}", now=1010.0)
        assert refused.value.status_code == 401 and refused.value.code == "invalid_api_key"


def test_the_list_shows_keys_but_never_a_secret(http):
    created = http.post("/v1/admin/tenants/alpha/keys", json={"name": "deploy"}, headers=ADMIN).json()
    listed = http.get("/v1/admin/tenants/alpha/keys", headers=ADMIN)
    assert listed.status_code == 200
    keys = listed.json()["data"]
    assert len(keys) == 2 and keys[1]["id"] == created["id"] and keys[1]["name"] == "deploy"
    assert created["api_key"] not in listed.text
    with http.platform.db.session() as session:
        hashes = [k.key_hash for k in tenant_repo.keys_of(session, tenant_repo.by_name(session, "alpha").tenant_id)]
    assert all(h not in listed.text for h in hashes)
    assert all("api_key" not in key and "key_hash" not in key for key in keys)
    assert {"id", "prefix", "name", "created_at", "last_used_at", "expires_at", "revoked_at"} <= keys[0].keys()


def test_last_use_is_recorded_at_most_once_a_minute(http):
    created = http.post("/v1/admin/tenants/alpha/keys", headers=ADMIN).json()
    assert created["last_used_at"] is None
    assert _jobs(http, created["api_key"]).status_code == 200
    used = {k["id"]: k for k in http.get("/v1/admin/tenants/alpha/keys", headers=ADMIN).json()["data"]}
    assert used[created["id"]]["last_used_at"] >= created["created_at"]
    with http.platform.db.session() as session:
        key, secret = tenant_service.create_key(session, "alpha")
        api_keys.authenticate(session, f"Bearer {secret}", now=5000.0)
        api_keys.authenticate(session, f"Bearer {secret}", now=5059.0)
        assert key.last_used_at == 5000
        api_keys.authenticate(session, f"Bearer {secret}", now=5060.0)
        assert key.last_used_at == 5060


def test_another_tenants_key_and_unknown_keys_are_not_found(http):
    betas = http.get("/v1/admin/tenants/beta/keys", headers=ADMIN).json()["data"]
    assert len(betas) == 1
    other = http.delete(f"/v1/admin/tenants/alpha/keys/{betas[0]['id']}", headers=ADMIN)
    assert other.status_code == 404 and other.json()["error"]["code"] == "not_found"
    assert http.delete("/v1/admin/tenants/alpha/keys/key-nothing", headers=ADMIN).status_code == 404
    assert http.get("/v1/admin/tenants/nobody/keys", headers=ADMIN).status_code == 404
    assert http.post("/v1/admin/tenants/nobody/keys", headers=ADMIN).status_code == 404
    # beta's key is untouched
    assert http.get("/v1/admin/tenants/beta/keys", headers=ADMIN).json()["data"][0]["revoked_at"] is None


@pytest.mark.parametrize("body", [
    {"expires_in_s": 0}, {"expires_in_s": -5}, {"expires_in_s": 10**12}, {"expires_in_s": "soon"},
    {"name": "x" * 129}, {"name": "tab\tbed"}, {"expires_at": 1}, {"expires_in_s": 60, "expires_at": 2**33},
    {"colour": "red"}, {"expires_at": 10**30}, [1, 2],
])
def test_bad_key_requests_are_400(http, body):
    response = http.post("/v1/admin/tenants/alpha/keys", json=body, headers=ADMIN)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_key_routes_need_the_admin_key(http):
    alpha = http.post("/v1/admin/tenants/alpha/keys", headers=ADMIN).json()["api_key"]
    for method, path in (("post", "/v1/admin/tenants/alpha/keys"), ("get", "/v1/admin/tenants/alpha/keys"),
                         ("delete", "/v1/admin/tenants/alpha/keys/key-x")):
        assert http.request(method, path).status_code == 401
        assert http.request(method, path, headers=_bearer(alpha)).status_code == 401
    assert http.delete("/v1/admin/tenants/alpha/keys/" + "k" * 65, headers=ADMIN).status_code == 400


def test_verified_keys_are_trusted_for_at_most_a_second(http):
    """The key cache of an API process: a revocation made elsewhere (another worker, another
    replica, the CLI) applies once the entry is a second old; expiry applies at once."""
    cache = api_keys.KeyCache(ttl_s=1.0)
    with http.platform.db.session() as session:
        key, secret = tenant_service.create_key(session, "alpha", expires_in_s=100, now=1000.0)
        key_id = key.key_id
    header = f"Bearer {secret}"
    assert cache.tenant(header, now=1000.0) is None  # never seen: ask the database
    with http.platform.db.session() as session:
        assert cache.verify(session, header, now=1000.0).name == "alpha"
    with http.platform.db.session() as session:
        tenant_service.revoke_key(session, "alpha", key_id, now=1000.2)
    first, second = cache.tenant(header, now=1000.5), cache.tenant(header, now=1000.9)
    assert first.name == second.name == "alpha"
    assert first is not second  # each request gets its own copy
    assert cache.tenant(header, now=1001.0) is None  # a second old: looked up again ...
    with http.platform.db.session() as session, pytest.raises(ApiError) as refused:
        cache.verify(session, header, now=1001.0)  # ... and refused
    assert refused.value.status_code == 401

    with http.platform.db.session() as session:
        _key, other = tenant_service.create_key(session, "alpha", expires_in_s=10, now=time.time())
    live = api_keys.KeyCache(ttl_s=60.0)
    with http.platform.db.session() as session:
        live.verify(session, f"Bearer {other}")
    with pytest.raises(ApiError):
        live.tenant(f"Bearer {other}", now=time.time() + 11)  # expired while cached
    with pytest.raises(ApiError):
        live.tenant(None)


def test_a_revocation_through_the_admin_api_applies_to_the_next_request(http):
    created = http.post("/v1/admin/tenants/alpha/keys", headers=ADMIN).json()
    for _ in range(3):  # cached now
        assert _jobs(http, created["api_key"]).status_code == 200
    http.post("/v1/admin/tenants/alpha/quota", headers=ADMIN, json={"max_queued_jobs": 7})
    assert http.platform.keys.tenant(f"Bearer {created['api_key']}") is None  # the change emptied the cache
    assert http.delete(f"/v1/admin/tenants/alpha/keys/{created['id']}", headers=ADMIN).status_code == 200
    assert _jobs(http, created["api_key"]).status_code == 401
