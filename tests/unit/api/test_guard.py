"""The edge: credentials before the body (no byte of it read for a caller without them), bounded
JSON checks for every media type the routes parse, and trainers' reports held to size and depth
but not to the tenants' string rules."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import pytest
from sqlalchemy import update
from sqlalchemy.exc import OperationalError

from tests.helpers.platform import add_tenant, make_platform
from tests.unit.api.test_usage import add_job
from tuneforge.api.app import create_app
from tuneforge.api.limits import MAX_INLINE_JSON_BYTES, MAX_JSON_VALUES
from tuneforge.db.tables import Attempt, Job
from tuneforge.services.training.reports import token_hash

ADMIN_KEY = "admin-secret-for-tests"
DEEP = b"[" * 100_000 + b"]" * 100_000


@dataclass
class Answer:
    status: int
    body: bytes
    headers: dict[str, str]
    body_reads: int = 0

    def error(self) -> dict:
        return json.loads(self.body)["error"]


@dataclass
class Edge:
    app: object
    platform: object
    key: str
    answers: list[Answer] = field(default_factory=list)

    def call(self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> Answer:
        """One request straight through the ASGI app, counting the times it asked for the body."""
        return asyncio.run(self._call(method, path, body, headers or {}))

    async def _call(self, method: str, path: str, body: bytes, headers: dict[str, str]) -> Answer:
        answer = Answer(0, b"", {})
        sent_body = False

        async def receive() -> dict:
            nonlocal sent_body
            answer.body_reads += 1
            if sent_body:
                return {"type": "http.disconnect"}
            sent_body = True
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict) -> None:
            if message["type"] == "http.response.start":
                answer.status = message["status"]
                answer.headers = {k.decode(): v.decode() for k, v in message.get("headers", [])}
            elif message["type"] == "http.response.body":
                answer.body += message.get("body", b"")

        raw_headers = [(b"content-length", str(len(body)).encode())] if body else []
        raw_headers += [(name.lower().encode(), value.encode()) for name, value in headers.items()]
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
                 "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
                 "headers": raw_headers, "client": ("127.0.0.1", 1), "server": ("testserver", 80)}
        await self.app(scope, receive, send)
        return answer

    def bearer(self, key: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {key or self.key}", "Content-Type": "application/json"}


@pytest.fixture
def edge(tmp_path, database_url):
    platform = make_platform(tmp_path, database_url, admin_api_key=ADMIN_KEY)
    key = add_tenant(platform, "alpha")
    yield Edge(create_app(platform=platform), platform, key)
    platform.db.dispose()


ANONYMOUS = {"Content-Type": "application/json"}


@pytest.mark.parametrize("path", ["/v1/fine_tuning/jobs", "/v1/chat/completions", "/v1/webhooks",
                                  "/v1/no/such/route", "/v1/files", "/v1/uploads/upload-x/parts"])
@pytest.mark.parametrize(("headers", "code"), [
    (ANONYMOUS, "missing_api_key"),
    ({**ANONYMOUS, "Authorization": "Bearer tf-not-a-key"}, "invalid_api_key"),
    ({**ANONYMOUS, "Authorization": "Basic abc"}, "invalid_api_key"),
])
def test_a_body_without_a_valid_key_is_401_and_never_read(edge, path, headers, code):
    answer = edge.call("POST", path, DEEP, headers)
    assert answer.status == 401 and answer.error()["code"] == code
    assert answer.headers["www-authenticate"] == "Bearer"
    assert answer.body_reads == 0


def test_an_anonymous_upload_is_refused_before_anything_is_spooled(edge):
    body = b"--xyz\r\nContent-Disposition: form-data; name=\"file\"; filename=\"big.jsonl\"\r\n\r\n" + b"x" * 65536
    answer = edge.call("POST", "/v1/files", body, {"Content-Type": "multipart/form-data; boundary=xyz"})
    assert (answer.status, answer.body_reads) == (401, 0)
    assert not list(edge.platform.settings.home.rglob("big.jsonl"))


def test_the_admin_api_checks_its_key_before_the_body(edge):
    wrong = edge.call("POST", "/v1/admin/tenants", DEEP, edge.bearer("not-the-admin-key"))
    assert (wrong.status, wrong.error()["message"], wrong.body_reads) == (401, "invalid admin API key", 0)
    tenant_key = edge.call("POST", "/v1/admin/tenants", DEEP, edge.bearer())  # a tenant's key is no admin key
    assert (tenant_key.status, tenant_key.body_reads) == (401, 0)
    admitted = edge.call("POST", "/v1/admin/tenants", DEEP, edge.bearer(ADMIN_KEY))
    assert (admitted.status, admitted.error()["code"]) == (400, "json_too_deep")


def test_with_the_admin_api_off_a_body_is_404_unread(tmp_path, database_url):
    platform = make_platform(tmp_path, database_url)
    try:
        answer = Edge(create_app(platform=platform), platform, "").call(
            "POST", "/v1/admin/tenants", DEEP, {"Authorization": "Bearer anything", **ANONYMOUS})
        assert (answer.status, answer.error()["code"], answer.body_reads) == (404, "not_found", 0)
    finally:
        platform.db.dispose()


def _attempt_with_token(platform, token: str) -> str:
    job_id = add_job(platform, "alpha", "running")
    with platform.db.session() as session:
        session.execute(update(Job).where(Job.job_id == job_id).values(attempt=1))
        session.add(Attempt(job_id=job_id, number=1, status="running", token_hash=token_hash(token), gpus=1,
                            heartbeat_at=time.time(), started_at=time.time()))
    return job_id


def test_a_trainer_report_is_read_only_with_a_token_of_its_job(edge):
    job_id = _attempt_with_token(edge.platform, "job-token-1")
    other_job = _attempt_with_token(edge.platform, "job-token-2")
    for path, headers in ((f"/internal/v1/jobs/{job_id}/heartbeat", ANONYMOUS),
                          (f"/internal/v1/jobs/{job_id}/heartbeat", edge.bearer("job-token-2")),  # another job's
                          (f"/internal/v1/jobs/{other_job}/events", edge.bearer(edge.key)),  # a tenant key
                          ("/internal/v1/jobs/ftjob-none/heartbeat", edge.bearer("job-token-1")),
                          ("/internal/elsewhere", edge.bearer("job-token-1"))):
        answer = edge.call("POST", path, DEEP, headers)
        assert (answer.status, answer.error()["code"], answer.body_reads) == (401, "invalid_job_token", 0), path
    deep = edge.call("POST", f"/internal/v1/jobs/{job_id}/heartbeat", DEEP, edge.bearer("job-token-1"))
    assert (deep.status, deep.error()["code"]) == (400, "json_too_deep")
    many = b'{"attempt": 1, "x": [' + b",".join([b"0"] * MAX_JSON_VALUES) + b"]}"
    assert edge.call("POST", f"/internal/v1/jobs/{job_id}/heartbeat", many,
                     edge.bearer("job-token-1")).error()["code"] == "json_too_many_values"


def test_a_trainer_report_is_not_held_to_the_tenant_string_rules(edge):
    job_id = _attempt_with_token(edge.platform, "job-token-1")
    body = json.dumps({"attempt": 1, "events": [{"seq": 1, "message": "loss \u0000 fell"}]}).encode()
    answer = edge.call("POST", f"/internal/v1/jobs/{job_id}/events", body, edge.bearer("job-token-1"))
    assert answer.status == 200, answer.body  # the report's own model takes it (or refuses it) from here
    assert edge.call("POST", "/v1/webhooks", body, edge.bearer()).error()["param"] == "events.0.message"


def test_a_public_route_never_reads_a_body(edge):
    answer = edge.call("POST", "/healthz", DEEP, ANONYMOUS)
    assert (answer.status, answer.body_reads) == (405, 0)
    assert edge.call("POST", "/console/x", DEEP, ANONYMOUS).body_reads == 0


def test_a_request_without_a_body_goes_to_its_route_as_before(edge):
    anonymous = edge.call("GET", "/v1/models")
    assert (anonymous.status, anonymous.error()["code"]) == (401, "missing_api_key")
    assert edge.call("GET", "/v1/models", headers=edge.bearer()).status == 200


@pytest.mark.parametrize("content_type", ["application/json", "text/json", "application/merge-patch+json",
                                          "application/json; charset=utf-8"])
def test_every_media_type_the_route_parses_as_json_is_checked(edge, content_type):
    headers = {**edge.bearer(), "Content-Type": content_type}
    assert edge.call("POST", "/v1/webhooks", DEEP, headers).error()["code"] == "json_too_deep"


def test_a_large_body_is_checked_off_the_event_loop_with_the_same_answer(edge):
    padding = "p" * (2 * MAX_INLINE_JSON_BYTES)
    body = json.dumps({"url": "https://example.com/\u0000", "description": padding}).encode()
    assert len(body) > MAX_INLINE_JSON_BYTES
    answer = edge.call("POST", "/v1/webhooks", body, edge.bearer())
    assert (answer.status, answer.error()["param"]) == (400, "url")


def test_a_database_too_busy_to_check_a_key_is_503_and_the_body_unread(edge, monkeypatch):
    async def busy(_authorization):
        raise OperationalError("SELECT", {}, Exception("database is locked"))

    monkeypatch.setattr(edge.app.state.key_lookups, "columns", busy)
    answer = edge.call("POST", "/v1/webhooks", DEEP, edge.bearer())
    assert (answer.status, answer.error()["code"], answer.body_reads) == (503, "server_busy", 0)
    assert answer.headers["retry-after"] == "1"


def test_a_tenant_over_its_limits_is_refused_before_its_body_is_read(tmp_path, database_url):
    platform = make_platform(tmp_path, database_url,
                             rate_limits={"standard": {"requests_per_s": 0.05, "window_s": 40, "concurrent": 8}})
    try:
        edge = Edge(create_app(platform=platform), platform, add_tenant(platform, "alpha"))
        body = json.dumps({"url": "https://example.com/\u0000"}).encode()
        # admitted once each, at the edge (the route does not count them again): two in the window
        for _ in range(2):
            answer = edge.call("POST", "/v1/webhooks", body, edge.bearer())
            assert (answer.status, answer.error()["param"]) == (400, "url")
            assert answer.headers["x-ratelimit-limit-requests"] == "2"
        over = edge.call("POST", "/v1/webhooks", DEEP, edge.bearer())
        assert (over.status, over.error()["code"], over.body_reads) == (429, "rate_limit_exceeded", 0)
        assert int(over.headers["retry-after"]) >= 1
    finally:
        platform.db.dispose()


def test_a_body_admitted_at_the_edge_is_counted_once_by_the_route_too(tmp_path, database_url):
    platform = make_platform(tmp_path, database_url,
                             rate_limits={"standard": {"requests_per_s": 0.05, "window_s": 60, "concurrent": 8}})
    try:
        edge = Edge(create_app(platform=platform), platform, add_tenant(platform, "alpha"))
        for remaining in ("2", "1", "0"):  # GET /v1/models with an (empty JSON) body, then without
            answer = edge.call("GET", "/v1/models", b"{}" if remaining != "0" else b"", edge.bearer())
            assert answer.status == 200 and answer.headers["x-ratelimit-remaining-requests"] == remaining
    finally:
        platform.db.dispose()


def test_a_tenant_cannot_hold_more_bodies_than_its_requests_in_flight(tmp_path, database_url):
    platform = make_platform(tmp_path, database_url, rate_limits={"standard": {"concurrent": 1}})
    try:
        edge = Edge(create_app(platform=platform), platform, add_tenant(platform, "alpha"))

        async def scenario() -> tuple[Answer, int]:
            arrived = asyncio.Event()
            release = asyncio.Event()
            sent: list[dict] = []

            async def slow_receive() -> dict:  # a client sending its body slowly
                arrived.set()
                await release.wait()
                return {"type": "http.request", "body": b"{}", "more_body": False}

            async def send(message: dict) -> None:
                sent.append(message)

            headers = [(b"content-length", b"2"), (b"authorization", f"Bearer {edge.key}".encode()),
                       (b"content-type", b"application/json")]
            scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                     "scheme": "http", "path": "/v1/webhooks", "raw_path": b"/v1/webhooks", "query_string": b"",
                     "root_path": "", "headers": headers, "client": ("127.0.0.1", 1), "server": ("testserver", 80)}
            first = asyncio.create_task(edge.app(scope, slow_receive, send))
            await arrived.wait()
            second = await edge._call("POST", "/v1/webhooks", DEEP, edge.bearer())
            release.set()
            await first
            return second, next(m["status"] for m in sent if m["type"] == "http.response.start")

        second, first_status = asyncio.run(scenario())
        assert (second.status, second.error()["code"], second.body_reads) == (429, "concurrency_limit_exceeded", 0)
        assert first_status == 400  # the first one, once its body came, got its own answer
    finally:
        platform.db.dispose()
