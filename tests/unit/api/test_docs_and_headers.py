"""Who may read the API reference (TUNEFORGE_DOCS_ACCESS), and the security headers on every answer."""

from __future__ import annotations

import asyncio
import io
import json
import re

import pytest
from fastapi.testclient import TestClient

from tests.helpers.platform import add_base_model, add_tenant, chat_lines, fake_model_dir, make_platform
from tuneforge.api.app import create_app
from tuneforge.api.docs import _inline_json
from tuneforge.api.headers import API_CSP, SecurityHeaders
from tuneforge.settings import Settings

PATHS = ("/openapi.json", "/docs", "/redoc")
ADMIN = {"Authorization": "Bearer s3cret-admin"}


@pytest.fixture
def build(tmp_path, database_url):
    made = []

    def _build(**overrides) -> TestClient:
        platform = make_platform(tmp_path / str(len(made)), database_url, **overrides)
        client = TestClient(create_app(platform=platform), raise_server_exceptions=False)
        made.append((client, platform))
        return client

    yield _build
    for client, platform in made:
        client.close()
        platform.db.dispose()


def test_docs_off_answers_404_but_the_schema_is_still_built_in_process(build):
    http = build(docs_access="off", admin_api_key="s3cret-admin")
    for path in PATHS:
        response = http.get(path, headers=ADMIN)
        assert response.status_code == 404 and response.json()["error"]["code"] == "docs_not_served"
        # the answer says how an operator turns it on, and where the console is
        message = response.json()["error"]["message"]
        assert "TUNEFORGE_DOCS_ACCESS=public" in message and "/console" in message
    assert "/v1/fine_tuning/jobs" in http.app.openapi()["paths"]


def test_docs_admin_needs_the_admin_key_and_is_off_without_one(build):
    http = build(admin_api_key="s3cret-admin")  # "admin" is the default
    tenant_key = add_tenant(http.app.state.platform, "alpha")
    for path in PATHS:
        refused = http.get(path)
        assert refused.status_code == 401
        assert 'curl -H "Authorization: Bearer $TUNEFORGE_ADMIN_API_KEY" http://testserver/openapi.json' in \
            refused.json()["error"]["message"]
        assert http.get(path, headers={"Authorization": f"Bearer {tenant_key}"}).status_code == 401
        assert http.get(path, headers=ADMIN).status_code == 200
    assert "/v1/admin/tenants/{name}/keys" in http.get("/openapi.json", headers=ADMIN).json()["paths"]

    without_admin = build()
    for path in PATHS:
        refused = without_admin.get(path, headers=ADMIN)
        assert refused.status_code == 404 and "TUNEFORGE_ADMIN_API_KEY" in refused.json()["error"]["message"]


def test_the_services_address_opens_the_console(build):
    http = build()
    for method in (http.get, http.head):
        response = method("/", follow_redirects=False)
        assert response.status_code == 307 and response.headers["location"] == "/console"
    assert http.get("/").url.path == "/console" and "<html" in http.get("/").text.lower()


def test_docs_public_are_open_and_the_pages_allow_only_what_they_load(build):
    http = build(docs_access="public")
    schema = http.get("/openapi.json")
    assert schema.status_code == 200 and schema.json() == http.app.openapi()
    assert schema.headers["content-security-policy"] == API_CSP
    for path in ("/docs", "/redoc"):
        page = http.get(path)
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        csp = page.headers["content-security-policy"]
        nonce = re.search(r"'nonce-([^']+)'", csp).group(1)
        assert f'<script nonce="{nonce}">' in page.text  # the page's own script runs by its nonce ...
        assert "script-src 'unsafe-inline'" not in csp and "frame-ancestors 'none'" in csp  # ... nothing else inline
        assert "/v1/fine_tuning/jobs" in page.text  # the schema is inline: no second request to authorize
        assert page.headers["x-frame-options"] == "DENY"
    assert http.get("/docs").headers["content-security-policy"] != http.get("/docs").headers["content-security-policy"]


def test_a_bad_docs_access_setting_is_refused():
    with pytest.raises(ValueError):
        Settings(docs_access="everyone")


def test_schema_text_cannot_close_the_script_it_sits_in():
    text = _inline_json({"description": "</script><script>alert(1)</script> & more"})
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text)["description"].startswith("</script>")


def _assert_secured(response, api: bool = True) -> None:
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["x-frame-options"] == "DENY"
    assert response.headers["referrer-policy"] == "no-referrer"
    if api:
        assert response.headers["cache-control"] == "no-store"
        assert response.headers["content-security-policy"] == "default-src 'none'; frame-ancestors 'none'"


def test_every_kind_of_answer_carries_the_security_headers(build):
    http = build()
    key = add_tenant(http.app.state.platform, "alpha")

    @http.app.get("/v1/explode", include_in_schema=False)
    def explode() -> None:
        raise RuntimeError("unexpected")

    _assert_secured(http.get("/v1/models", headers={"Authorization": f"Bearer {key}"}))
    _assert_secured(http.get("/v1/models"))  # 401
    _assert_secured(http.get("/v1/nowhere"))  # 404
    _assert_secured(http.post("/v1/fine_tuning/jobs", headers={"Authorization": f"Bearer {key}"}, json=[]))  # 400
    failed = http.get("/v1/explode")
    assert failed.status_code == 500
    _assert_secured(failed)
    _assert_secured(http.get("/healthz"))


def test_streamed_job_events_carry_the_headers(build, tmp_path):
    http = build()
    platform = http.app.state.platform
    add_base_model(platform, "tiny-base", fake_model_dir(tmp_path / "model"))
    auth = {"Authorization": f"Bearer {add_tenant(platform, 'alpha')}"}
    file_id = http.post("/v1/files", headers=auth, data={"purpose": "fine-tune"},
                        files={"file": ("train.jsonl", io.BytesIO(chat_lines(20)))}).json()["id"]
    job = http.post("/v1/fine_tuning/jobs", headers=auth, json={"model": "tiny-base", "training_file": file_id})
    assert job.status_code == 200, job.text
    job_id = job.json()["id"]
    assert http.post(f"/v1/fine_tuning/jobs/{job_id}/cancel", headers=auth).status_code == 200
    with http.stream("GET", f"/v1/fine_tuning/jobs/{job_id}/events?stream=true", headers=auth) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        _assert_secured(response)
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"


def test_the_middleware_passes_each_chunk_on_at_once():
    """A stream's first chunk reaches the server before the app has produced the rest."""
    sent: list[dict] = []

    async def run() -> None:
        release = asyncio.Event()

        async def streaming_app(scope, receive, send) -> None:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream")]})
            await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
            await release.wait()
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})

        async def send(message: dict) -> None:
            sent.append(message)

        async def receive() -> dict:
            return {"type": "http.disconnect"}

        task = asyncio.create_task(SecurityHeaders(streaming_app)({"type": "http", "path": "/v1/x"}, receive, send))
        for _ in range(100):
            if len(sent) == 2:
                break
            await asyncio.sleep(0)
        assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
        assert not task.done()
        release.set()
        await task

    asyncio.run(run())
    headers = dict(sent[0]["headers"])
    assert headers[b"x-content-type-options"] == b"nosniff" and headers[b"content-type"] == b"text/event-stream"
    assert sent[-1]["body"] == b"data: [DONE]\n\n"
