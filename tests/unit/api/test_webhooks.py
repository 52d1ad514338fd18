"""/v1/webhooks: register, list, retrieve, delete, deliveries; validation and tenancy."""

from __future__ import annotations

import base64
import time

import pytest

from tuneforge.db.repos import jobs as job_repo
from tuneforge.db.repos import tenants as tenant_repo
from tuneforge.db.tables import Job
from tuneforge.domain.ids import new_id
from tuneforge.domain.job_config import JobRequest
from tuneforge.domain.status import JobStatus
from tuneforge.services.training.transitions import transition

ALL_EVENTS = ["fine_tuning.job.succeeded", "fine_tuning.job.failed", "fine_tuning.job.cancelled"]


def _resolve(host: str) -> list[str]:
    """example.com names answer a public address; anything else does not resolve."""
    if host == "example.com" or host.endswith(".example.com"):
        return ["93.184.216.34"]
    raise OSError(f"{host} does not resolve")


@pytest.fixture(autouse=True)
def _no_real_dns(world):
    """The egress policy of the platform's settings, with the resolver above instead of DNS."""
    world.http.app.state.egress_resolver = _resolve


def _create(world, key: str, **body) -> dict:
    response = world.http.post("/v1/webhooks", json=body, headers=world.headers(key))
    assert response.status_code == 200, response.text
    return response.json()


def _finished_job(world, tenant_name: str, status: JobStatus) -> str:
    with world.platform.db.session() as session:
        tenant = tenant_repo.by_name(session, tenant_name)
        job = Job(job_id=new_id("ftjob"), tenant_id=tenant.tenant_id, model=world.base_model,
                  base_model_sha256="0" * 64, training_file="file-x", status="running", attempt=1, seed=1,
                  request=JobRequest(model=world.base_model, training_file="file-x"), result_files=[],
                  request_hash="0" * 64, created_at=int(time.time()))
        session.add(job)
    with world.platform.db.session() as session:
        transition(session, job_repo.get_for_update(session, job.job_id), status, "test")
    return job.job_id


def test_register_list_retrieve_delete(world):
    created = _create(world, world.key_a, url="https://hooks.example.com/tuneforge")
    assert created["id"].startswith("whep_") and created["object"] == "webhook_endpoint"
    assert created["url"] == "https://hooks.example.com/tuneforge"
    assert created["events"] == ALL_EVENTS
    assert created["secret"].startswith("whsec_")
    assert len(base64.b64decode(created["secret"][len("whsec_"):])) == 32
    second = _create(world, world.key_a, url="http://93.184.216.34:8080/hook", events=["fine_tuning.job.failed"] * 2)
    assert second["events"] == ["fine_tuning.job.failed"] and second["secret"] != created["secret"]

    listed = world.http.get("/v1/webhooks", headers=world.headers(world.key_a)).json()
    assert [item["id"] for item in listed["data"]] == [second["id"], created["id"]]  # newest first
    assert all("secret" not in item for item in listed["data"])  # shown once, at creation
    first_page = world.http.get("/v1/webhooks?limit=1", headers=world.headers(world.key_a)).json()
    assert len(first_page["data"]) == 1 and first_page["has_more"] is True
    got = world.http.get(f"/v1/webhooks/{created['id']}", headers=world.headers(world.key_a)).json()
    assert got == {key: value for key, value in created.items() if key != "secret"}

    deleted = world.http.delete(f"/v1/webhooks/{created['id']}", headers=world.headers(world.key_a))
    assert deleted.json() == {"id": created["id"], "object": "webhook_endpoint", "deleted": True}
    assert world.http.get(f"/v1/webhooks/{created['id']}", headers=world.headers(world.key_a)).status_code == 404
    again = world.http.delete(f"/v1/webhooks/{created['id']}", headers=world.headers(world.key_a))
    assert again.status_code == 404
    listed = world.http.get("/v1/webhooks", headers=world.headers(world.key_a)).json()
    assert [item["id"] for item in listed["data"]] == [second["id"]]


def test_another_tenants_endpoint_is_not_found(world):
    created = _create(world, world.key_a, url="https://hooks.example.com/a")
    for method, path in (("GET", ""), ("DELETE", ""), ("GET", "/deliveries")):
        response = world.http.request(method, f"/v1/webhooks/{created['id']}{path}", headers=world.headers(world.key_b))
        assert response.status_code == 404, (method, path)
        assert response.json()["error"]["param"] == "webhook_id"
    assert world.http.get("/v1/webhooks", headers=world.headers(world.key_b)).json()["data"] == []
    # still there for its owner
    assert world.http.get(f"/v1/webhooks/{created['id']}", headers=world.headers(world.key_a)).status_code == 200


@pytest.mark.parametrize("body, param, code", [
    ({"url": "ftp://hooks.example.com/x"}, "url", "invalid_url"),
    ({"url": "hooks.example.com/x"}, "url", "invalid_url"),
    ({"url": "https://"}, "url", "invalid_url"),
    ({"url": "http://host:99999/x"}, "url", "invalid_url"),
    ({"url": "https://h.example.com/" + "x" * 2100}, "url", "invalid_url"),
    ({"url": ""}, "url", "invalid_url"),
    ({}, "url", "missing_required_parameter"),
    ({"url": "https://h.example.com", "events": []}, "events", None),
    ({"url": "https://h.example.com", "events": ["fine_tuning.job.started"]}, "events", "invalid_event_type"),
    ({"url": "https://h.example.com", "events": "fine_tuning.job.failed"}, "events", "invalid_value"),
    ({"url": "https://h.example.com", "secret": "whsec_mine"}, "secret", "unknown_parameter"),
])
def test_bad_registration_answers_400_naming_the_param(world, body, param, code):
    response = world.http.post("/v1/webhooks", json=body, headers=world.headers(world.key_a))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, code)
    assert world.http.get("/v1/webhooks", headers=world.headers(world.key_a)).json()["data"] == []


def test_at_most_20_endpoints_per_tenant(world):
    for n in range(20):
        _create(world, world.key_a, url=f"https://hooks.example.com/{n}")
    response = world.http.post("/v1/webhooks", json={"url": "https://hooks.example.com/21"},
                               headers=world.headers(world.key_a))
    assert response.status_code == 400 and response.json()["error"]["code"] == "too_many_webhook_endpoints"
    _create(world, world.key_b, url="https://hooks.example.com/b")  # another tenant's count is its own


def test_deliveries_show_each_events_status_for_debugging(world):
    world.platform.settings = world.platform.settings.model_copy(update={"egress_allow": "127.0.0.1"})
    failed_only = _create(world, world.key_a, url="http://127.0.0.1:9/hook", events=["fine_tuning.job.failed"])
    _finished_job(world, "alpha", JobStatus.SUCCEEDED)
    failed_job = _finished_job(world, "alpha", JobStatus.FAILED)
    _finished_job(world, "beta", JobStatus.FAILED)

    page = world.http.get(f"/v1/webhooks/{failed_only['id']}/deliveries", headers=world.headers(world.key_a)).json()
    [delivery] = page["data"]
    assert delivery["id"].startswith("evt_") and delivery["object"] == "webhook_delivery"
    assert (delivery["type"], delivery["status"], delivery["attempts"]) == ("fine_tuning.job.failed", "pending", 0)
    assert (delivery["last_status_code"], delivery["last_error"], delivery["delivered_at"]) == (None, None, None)
    assert delivery["event"]["data"]["id"] == failed_job and delivery["event"]["id"] == delivery["id"]
    assert delivery["endpoint_id"] == failed_only["id"] and page["has_more"] is False
