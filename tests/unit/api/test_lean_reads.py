"""The lean reads (api/lean_reads.py) answer exactly what the ORM path answers: the job object
(with a queued job's place), pages of jobs and of events in OpenAI's list shape, and a new
rendering whenever a job's row changed; on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import io
from dataclasses import dataclass

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from tests.helpers.platform import add_base_model, add_running_job, add_tenant, chat_lines, make_platform
from tuneforge.api.app import create_app
from tuneforge.api.lean_reads import JobBodies
from tuneforge.api.objects import event_object, job_object, list_object
from tuneforge.db.repos import events
from tuneforge.db.repos import jobs as job_repo
from tuneforge.db.repos import tenants as tenant_repo
from tuneforge.db.tables import Job
from tuneforge.services.context import Platform
from tuneforge.services.training import jobs as job_service
from tuneforge.services.training import queue as queue_service


@dataclass
class Api:
    platform: Platform
    http: TestClient
    key: str
    tenant_id: str

    def get(self, path: str, key: str | None = None):
        return self.http.get(path, headers={"Authorization": f"Bearer {key or self.key}"})

    def create(self, file_id: str, **extra) -> dict:
        answer = self.http.post("/v1/fine_tuning/jobs", json={"model": "tiny-chat", "training_file": file_id, **extra},
                                headers={"Authorization": f"Bearer {self.key}"})
        assert answer.status_code == 200, answer.text
        return answer.json()

    def set(self, job_id: str, **values) -> None:
        with self.platform.db.session() as session:
            session.execute(update(Job).where(Job.job_id == job_id).values(**values))

    def reference(self, job_id: str) -> dict:
        """The job as the ORM path renders it: job_object, plus the queue place of a queued job."""
        with self.platform.db.session() as session:
            job = job_repo.get(session, self.tenant_id, job_id)
            body = job_object(job)
            if job.status == "queued":
                body["queue"] = queue_service.place_of(session, self.platform, job)
            return body

    def reference_page(self, after: str | None, limit: int) -> dict:
        with self.platform.db.session() as session:
            page = job_repo.page(session, self.tenant_id, metadata={}, after=after, limit=limit)
            return list_object(page.rows, job_object, page.has_more)


@pytest.fixture
def api(tmp_path, database_url, tiny_model_dir) -> Api:
    platform = make_platform(tmp_path, database_url)
    add_base_model(platform, "tiny-chat", tiny_model_dir)
    key = add_tenant(platform, "alpha")
    http = TestClient(create_app(platform=platform), raise_server_exceptions=False)
    with platform.db.session() as session:
        tenant_id = tenant_repo.by_name(session, "alpha").tenant_id
    yield Api(platform, http, key, tenant_id)
    http.close()
    platform.db.dispose()


def _upload(api: Api, lines: bytes) -> str:
    answer = api.http.post("/v1/files", files={"file": ("train.jsonl", io.BytesIO(lines))},
                           data={"purpose": "fine-tune"}, headers={"Authorization": f"Bearer {api.key}"})
    assert answer.status_code == 200, answer.text
    return answer.json()["id"]


def test_a_job_read_lean_is_the_job_the_orm_renders_in_every_state(api):
    training = _upload(api, chat_lines(20))
    plain = api.create(training)
    detailed = api.create(training, suffix="codes", seed=7, metadata={"team": "search", "run": "7"},
                          method={"type": "supervised", "supervised": {"hyperparameters": {
                              "n_epochs": 2, "learning_rate_multiplier": 0.5}}},
                          training_type={"type": "lora", "rank": 4, "alpha": 8})
    cancelled = api.create(training)
    assert api.http.post(f"/v1/fine_tuning/jobs/{cancelled['id']}/cancel",
                         headers={"Authorization": f"Bearer {api.key}"}).status_code == 200
    failed = api.create(training)
    api.set(failed["id"], status="failed", finished_at=1_800_000_000,
            error={"code": "invalid_training_file", "message": "line 3: no messages", "param": "training_file"})
    unvalidated = api.create(training)
    api.set(unvalidated["id"], status="validating_files", resolved=None)
    assert plain["status"] == "queued" and detailed["status"] == "queued"  # validated at once (a small file)

    for job in (plain, detailed, cancelled, failed, unvalidated):
        answer = api.get(f"/v1/fine_tuning/jobs/{job['id']}")
        assert answer.status_code == 200
        assert answer.headers["content-type"] == "application/json"
        assert answer.json() == api.reference(job["id"]), job["id"]
    queued = api.get(f"/v1/fine_tuning/jobs/{detailed['id']}").json()
    assert queued["queue"]["position"] == 2 and queued["metadata"] == {"team": "search", "run": "7"}
    assert queued["user_provided_suffix"] == "codes" and queued["estimate"] is not None
    assert "queue" not in api.get(f"/v1/fine_tuning/jobs/{failed['id']}").json()


def test_another_tenants_or_an_unknown_job_is_404_with_the_same_message(api):
    beta_key, _, beta_job = add_running_job(api.platform, "beta")
    assert api.get(f"/v1/fine_tuning/jobs/{beta_job}", key=beta_key).json()["status"] == "running"
    for job_id in (beta_job, "ftjob-unknown"):
        answer = api.get(f"/v1/fine_tuning/jobs/{job_id}")
        assert answer.status_code == 404
        assert answer.json()["error"] == {"message": f"No such fine-tuning job: {job_id}",
                                          "type": "invalid_request_error", "param": "fine_tuning_job_id",
                                          "code": "not_found"}


def test_a_changed_row_is_rendered_again_and_the_queue_place_follows_the_queue(api):
    training = _upload(api, chat_lines(20))
    first, second = api.create(training), api.create(training)
    path = f"/v1/fine_tuning/jobs/{second['id']}"
    before = api.get(path).json()
    assert before["queue"]["position"] == 2 and api.get(path).json() == before  # remembered, same answer
    api.set(second["id"], user_metadata={"note": "changed"})
    assert api.get(path).json()["metadata"] == {"note": "changed"}
    # the job ahead is cancelled: an event is written, so the queue is computed again at once
    assert api.http.post(f"/v1/fine_tuning/jobs/{first['id']}/cancel",
                         headers={"Authorization": f"Bearer {api.key}"}).status_code == 200
    after = api.get(path).json()
    assert after["queue"]["position"] == 1 and after == api.reference(second["id"])
    api.set(second["id"], status="running", started_at=1_800_000_100)
    running = api.get(path).json()
    assert running["status"] == "running" and "queue" not in running and running == api.reference(second["id"])


def test_pages_are_the_pages_the_orm_path_answers(api):
    empty = api.get("/v1/fine_tuning/jobs").json()
    assert empty == {"object": "list", "data": [], "has_more": False, "first_id": None, "last_id": None}
    training = _upload(api, chat_lines(20))
    ids = [api.create(training, metadata={"n": str(i)})["id"] for i in range(5)]
    add_running_job(api.platform, "beta")  # another tenant's job is never on alpha's pages
    after = None
    seen: list[str] = []
    for _ in range(3):
        url = "/v1/fine_tuning/jobs?limit=2" + (f"&after={after}" if after else "")
        page = api.get(url).json()
        assert page == api.reference_page(after, 2)
        seen += [job["id"] for job in page["data"]]
        after = page["last_id"]
    assert seen == ids[::-1] and page["has_more"] is False
    assert api.get("/v1/fine_tuning/jobs?after=ftjob-unknown").json()["data"] == []
    whole = api.get("/v1/fine_tuning/jobs?limit=100").json()
    assert [job["id"] for job in whole["data"]] == ids[::-1] and whole == api.reference_page(None, 100)
    # a metadata filter takes the plain path, same shape
    assert [job["id"] for job in api.get("/v1/fine_tuning/jobs?metadata[n]=3").json()["data"]] == [ids[3]]
    assert api.get("/v1/fine_tuning/jobs?limit=0").status_code == 400


def test_the_renderings_kept_are_bounded_and_evicted_oldest_first(api):
    training = _upload(api, chat_lines(20))
    ids = [api.create(training)["id"] for _ in range(3)]
    bodies = JobBodies(api.platform, size=2)

    def read(tenant_id: str, job_id: str) -> bytes | None:
        return asyncio.run(bodies.read(tenant_id, job_id))

    for job_id in ids:
        assert read(api.tenant_id, job_id) is not None
    assert list(bodies._rendered) == ids[1:]
    assert read(api.tenant_id, ids[1]) is not None  # used again: now the newest
    assert read(api.tenant_id, ids[0]) is not None
    assert list(bodies._rendered) == [ids[1], ids[0]]
    assert read("tenant-other", ids[0]) is None


def _reference_events(api: Api, job_id: str, after: str | None, limit: int) -> dict:
    with api.platform.db.session() as session:
        page = job_service.list_events(session, api.tenant_id, job_id, after=after, limit=limit)
        return list_object(page.rows, event_object, page.has_more)


def test_event_pages_are_the_pages_the_orm_path_answers(api):
    job_id = api.create(_upload(api, chat_lines(20)))["id"]
    with api.platform.db.session() as session:
        job = job_repo.get(session, api.tenant_id, job_id)
        events.add(session, job, "Step 1/10: training loss=2.31", event_type="metrics",
                   data={"step": 1, "train_loss": 2.31, "nested": {"lr": [1e-4, None]}})
        events.add(session, job, "a warning with no data", level="warn")
        events.add(session, job, "data that is empty", data={})
        for step in range(2, 8):
            events.add(session, job, f"Step {step}/10", event_type="metrics", data={"step": step})
    whole = api.get(f"/v1/fine_tuning/jobs/{job_id}/events?limit=100").json()
    assert whole == _reference_events(api, job_id, None, 100) and len(whole["data"]) >= 11
    assert whole["data"][-1]["message"].startswith("Created fine-tuning job")  # newest first
    metrics = next(event for event in whole["data"] if event["message"].startswith("Step 1/10"))
    assert metrics["data"] == {"step": 1, "train_loss": 2.31, "nested": {"lr": [1e-4, None]}}
    assert metrics["type"] == "metrics" and metrics["object"] == "fine_tuning.job.event"
    assert all(event["data"] == {} for event in whole["data"] if event["message"] in
               ("a warning with no data", "data that is empty"))
    after, seen = None, []
    while True:
        url = f"/v1/fine_tuning/jobs/{job_id}/events?limit=4" + (f"&after={after}" if after else "")
        page = api.get(url).json()
        assert page == _reference_events(api, job_id, after, 4)
        seen += [event["id"] for event in page["data"]]
        if not page["has_more"]:
            break
        after = page["last_id"]
    assert seen == [event["id"] for event in whole["data"]]
    assert api.get(f"/v1/fine_tuning/jobs/{job_id}/events?after=ftevent-unknown").json()["data"] == []


def test_another_tenants_jobs_events_are_404(api):
    beta_key, _, beta_job = add_running_job(api.platform, "beta")
    assert api.get(f"/v1/fine_tuning/jobs/{beta_job}/events", key=beta_key).status_code == 200
    for job_id in (beta_job, "ftjob-unknown"):
        answer = api.get(f"/v1/fine_tuning/jobs/{job_id}/events")
        assert answer.status_code == 404
        assert answer.json()["error"]["message"] == f"No such fine-tuning job: {job_id}"


def test_get_job_is_answered_before_the_app_with_the_routes_headers(api, monkeypatch):
    _, _, job_id = add_running_job(api.platform, "gamma")
    import tuneforge.api.routes.jobs as job_routes

    def the_route(*_args, **_kwargs):
        raise AssertionError("GET job reached the app's route")

    monkeypatch.setattr(job_routes, "job_answer", the_route)
    training = _upload(api, chat_lines(12))
    job = api.create(training)
    answer = api.get(f"/v1/fine_tuning/jobs/{job['id']}")
    assert answer.status_code == 200 and answer.json() == api.reference(job["id"])
    assert answer.headers["content-type"] == "application/json"
    assert int(answer.headers["content-length"]) == len(answer.content)
    assert answer.headers["x-content-type-options"] == "nosniff"  # the security headers, added outside
    assert int(answer.headers["x-ratelimit-limit-requests"]) > 0  # the tier's limits, counted
    # the API's own errors, from the hot path as from the route: no key, a bad key, another's job
    assert api.http.get(f"/v1/fine_tuning/jobs/{job['id']}").status_code == 401
    assert api.get(f"/v1/fine_tuning/jobs/{job['id']}", key="sk-wrong").status_code == 401
    other = api.get(f"/v1/fine_tuning/jobs/{job_id}")
    assert other.status_code == 404 and other.json()["error"]["param"] == "fine_tuning_job_id"
    assert other.headers["x-content-type-options"] == "nosniff"
    # what is not exactly GET job goes to the app: more segments, a NUL in the query
    assert api.get(f"/v1/fine_tuning/jobs/{job['id']}/events").status_code == 200
    assert api.get(f"/v1/fine_tuning/jobs/{job['id']}?x=%00").status_code == 400


def test_an_error_that_is_not_the_apis_goes_to_the_app_which_reports_it(api, monkeypatch, caplog):
    training = _upload(api, chat_lines(12))
    job = api.create(training)
    bodies = api.http.app.state.job_bodies
    real_read, calls = bodies.read, []

    async def failing_once(tenant_id: str, job_id: str):
        calls.append(job_id)
        if len(calls) == 1:
            raise RuntimeError("the database went away")
        return await real_read(tenant_id, job_id)

    monkeypatch.setattr(bodies, "read", failing_once)
    answer = api.get(f"/v1/fine_tuning/jobs/{job['id']}")
    assert answer.status_code == 200 and answer.json()["id"] == job["id"]  # the app's route read it again
    assert calls == [job["id"], job["id"]]

    async def always_failing(tenant_id: str, job_id: str):
        raise RuntimeError("the database went away")

    monkeypatch.setattr(bodies, "read", always_failing)
    answer = api.get(f"/v1/fine_tuning/jobs/{job['id']}")
    assert answer.status_code == 500 and answer.json()["error"]["code"] == "internal_error"
    request_id = answer.headers["x-request-id"]
    assert "went away" not in answer.text and request_id in answer.text
    assert any(request_id in record.getMessage() for record in caplog.records)
