"""Inputs that used to answer 500 now answer 4xx in OpenAI's envelope naming the field, and the
OpenAPI document says so (400, never 422)."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from tests.helpers.platform import add_base_model, add_tenant, fake_model_dir, make_platform
from tuneforge.api.app import create_app
from tuneforge.api.limits import MAX_JSON_BODY_BYTES, MULTIPART_OVERHEAD_BYTES
from tuneforge.db.tables import FileRow


class Api:
    def __init__(self, platform, key: str) -> None:
        self.platform = platform
        self.http = TestClient(create_app(platform=platform), raise_server_exceptions=False)
        self.auth = {"Authorization": f"Bearer {key}"}

    def post_json(self, path: str, raw: bytes):
        return self.http.post(path, content=raw, headers={**self.auth, "Content-Type": "application/json"})


@pytest.fixture
def api(tmp_path, database_url):
    platform = make_platform(tmp_path, database_url)
    add_base_model(platform, "tiny-base", fake_model_dir(tmp_path / "model"))
    client = Api(platform, add_tenant(platform, "alpha"))
    yield client
    client.http.close()
    platform.db.dispose()


def error_of(response, status: int, param: str | None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param, error
    return error


@pytest.mark.parametrize("filename", [".", ".."])
def test_upload_named_dot_or_dot_dot_is_a_400(api, filename):
    answer = api.http.post("/v1/files", headers=api.auth, data={"purpose": "batch"}, files={"file": (filename, b"x")})
    assert error_of(answer, 400, "file")["code"] == "invalid_filename"


def test_non_ascii_filename_downloads_with_rfc5987_name(api):
    created = api.http.post("/v1/files", headers=api.auth, data={"purpose": "batch"},
                            files={"file": ("données €.jsonl", b"abc")}).json()
    answer = api.http.get(f"/v1/files/{created['id']}/content", headers=api.auth)
    assert answer.status_code == 200 and answer.content == b"abc"
    disposition = answer.headers["content-disposition"]
    assert 'filename="donn_es _.jsonl"' in disposition
    assert "filename*=UTF-8''donn%C3%A9es%20%E2%82%AC.jsonl" in disposition


@pytest.mark.parametrize(("field", "value"), [("seed", 2**70), ("max_tokens", 2**70), ("max_tokens", 2**40),
                                              ("max_completion_tokens", -(2**70)), ("n", 2**64)])
def test_chat_numbers_out_of_range_are_400(api, field, value):
    body = {"model": "tiny-base", "messages": [{"role": "user", "content": "hi"}], field: value}
    error_of(api.post_json("/v1/chat/completions", json.dumps(body).encode()), 400, field)


def test_lone_surrogate_in_a_message_is_400(api):
    raw = b'{"model": "tiny-base", "messages": [{"role": "user", "content": "a\\ud800b"}]}'
    error_of(api.post_json("/v1/chat/completions", raw), 400, "messages.0.content")


def test_lone_surrogate_in_the_model_name_is_400(api):
    raw = b'{"model": "\\udc00", "messages": [{"role": "user", "content": "a"}]}'
    error_of(api.post_json("/v1/chat/completions", raw), 400, "model")


def test_nul_in_a_stored_string_is_400(api):
    raw = b'{"url": "https://example.com/\\u0000", "events": []}'
    error_of(api.post_json("/v1/webhooks", raw), 400, "url")
    error_of(api.http.get("/v1/files?after=a%00b", headers=api.auth), 400, None)


@pytest.mark.parametrize(("raw", "param"), [
    (b'{"model": "tiny-base", "messages": [{"role": "user", "content": "x"}], "temperature": 1e400}', "temperature"),
    (b'{"model": "tiny-base", "messages": [{"role": "user", "content": "x"}], "top_p": NaN}', "top_p"),
])
def test_non_finite_numbers_in_inference_are_400(api, raw, param):
    error_of(api.post_json("/v1/chat/completions", raw), 400, param)


def test_infinite_hyperparameter_is_400(api):
    raw = (b'{"model": "tiny-base", "training_file": "file-x", '
           b'"method": {"type": "supervised", "supervised": {"hyperparameters": {"learning_rate_multiplier": 1e400}}}}')
    error_of(api.post_json("/v1/fine_tuning/jobs", raw), 400,
             "method.supervised.hyperparameters.learning_rate_multiplier")


@pytest.mark.parametrize("path", ["/v1/fine_tuning/jobs", "/v1/webhooks", "/v1/chat/completions"])
def test_very_deep_json_is_400(api, path):
    deep = b"[" * 100_000 + b"]" * 100_000
    assert error_of(api.post_json(path, deep), 400, None)["code"] == "json_too_deep"
    nested = {"model": "tiny-base", "training_file": "file-x", "metadata": {}}
    inner = nested["metadata"]
    for _ in range(70):
        inner["k"] = {}
        inner = inner["k"]
    error = error_of(api.post_json(path, json.dumps(nested).encode()), 400, "metadata" + ".k" * 63)
    assert error["code"] == "json_too_deep"


def test_a_trainer_report_without_its_job_token_is_401_before_its_body_is_read(api):
    # a tenant's key is no job token: refused from the headers, the deep body never parsed
    # (tests/unit/api/test_guard.py: a valid token's deep report is the 400)
    deep = b"[" * 100_000 + b"]" * 100_000
    assert (error_of(api.post_json("/internal/v1/jobs/ftjob-x/heartbeat", deep), 401, None)["code"]
            == "invalid_job_token")


def test_json_body_over_the_limit_is_413(api):
    raw = b'{"url": "' + b"a" * MAX_JSON_BODY_BYTES + b'"}'
    assert error_of(api.post_json("/v1/webhooks", raw), 413, None)["code"] == "request_too_large"


def test_download_step_beyond_int64_is_400(api):
    error_of(api.http.get(f"/v1/fine_tuning/jobs/ftjob-x/download?step={2**70}", headers=api.auth), 400, "step")


@pytest.mark.parametrize("month", ["9999-12", "1970-01"])
def test_usage_of_extreme_months_is_answered(api, month):
    answer = api.http.get(f"/v1/usage?month={month}", headers=api.auth)
    assert answer.status_code == 200 and answer.json()["totals"]["month"] == month


@pytest.mark.parametrize("month", ["0000-01", "2026-13", "2026-00", "99999-01", "2026-1", "x"])
def test_usage_of_odd_months_is_400(api, month):
    error_of(api.http.get("/v1/usage", params={"month": month}, headers=api.auth), 400, "month")


def test_admin_usage_checks_its_month(tmp_path, database_url):
    platform = make_platform(tmp_path, database_url, admin_api_key="admin-secret")
    http = TestClient(create_app(platform=platform), raise_server_exceptions=False)
    try:
        admin = {"Authorization": "Bearer admin-secret"}
        error_of(http.get("/v1/admin/usage?month=2026-13", headers=admin), 400, "month")
        assert http.get("/v1/admin/usage?month=9999-12", headers=admin).status_code == 200
        quota = http.post("/v1/admin/tenants/x/quota", headers={**admin, "Content-Type": "application/json"},
                          content=b'{"gpu_hours_hard": 1e400}')
        error_of(quota, 400, "gpu_hours_hard")
    finally:
        http.close()
        platform.db.dispose()


# ---- uploads over the tier's limit ---------------------------------------------------------------

def test_upload_over_the_tier_limit_is_413_while_streaming(tmp_path, database_url):
    limit = 4096
    platform = make_platform(tmp_path, database_url, max_upload_bytes_standard=limit)
    key = add_tenant(platform, "small")
    http = TestClient(create_app(platform=platform), raise_server_exceptions=False)
    read_chunks = []

    def body():  # streamed without a Content-Length: the guard has to count
        boundary = b"--xyz\r\n"
        yield boundary + b'Content-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        yield boundary + b'Content-Disposition: form-data; name="file"; filename="big.jsonl"\r\n\r\n'
        for _ in range(200):
            read_chunks.append(1)
            yield b"x" * 4096
        yield b"\r\n--xyz--\r\n"

    try:
        answer = http.post("/v1/files", content=body(), headers={
            "Authorization": f"Bearer {key}", "Content-Type": "multipart/form-data; boundary=xyz"})
        error = error_of(answer, 413, None)
        assert error["code"] == "request_too_large"
        assert str(limit + MULTIPART_OVERHEAD_BYTES) in error["message"]
        with platform.db.session() as session:
            assert session.query(FileRow).count() == 0
        assert not list((platform.settings.home).rglob("big.jsonl"))
        # a declared length over the limit is refused before the body is read
        declared = http.post("/v1/files", content=b"x" * (limit + MULTIPART_OVERHEAD_BYTES + 1), headers={
            "Authorization": f"Bearer {key}", "Content-Type": "multipart/form-data; boundary=xyz"})
        error_of(declared, 413, None)
        # within the edge's allowance but over the file limit: the service counts the file exactly
        small = http.post("/v1/files", headers={"Authorization": f"Bearer {key}"}, data={"purpose": "batch"},
                          files={"file": ("a.jsonl", b"y" * (limit + 1))})
        assert error_of(small, 413, "file")["code"] == "file_too_large"
    finally:
        http.close()
        platform.db.dispose()


# ---- the OpenAPI document --------------------------------------------------------------------------

def test_openapi_documents_400_with_the_envelope_and_no_422(api):
    document = api.http.app.openapi()
    assert '"422"' not in json.dumps(document)
    assert "HTTPValidationError" not in document["components"]["schemas"]
    envelope = document["components"]["schemas"]["ErrorEnvelope"]
    assert envelope["required"] == ["error"]
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            responses = operation["responses"]
            assert responses["400"]["content"]["application/json"]["schema"] == {
                "$ref": "#/components/schemas/ErrorEnvelope"}, (method, path)
            assert "401" in responses, (method, path)
            if "requestBody" in operation:
                assert "413" in responses, (method, path)
    chat = document["paths"]["/v1/chat/completions"]["post"]["responses"]
    assert {"404", "503"} <= set(chat)
    assert {"403", "409", "429"} <= set(document["paths"]["/v1/fine_tuning/jobs"]["post"]["responses"])
    bounds = document["components"]["schemas"]["ChatCompletionBody"]["properties"]
    assert bounds["seed"]["anyOf"][0]["maximum"] == float(2**63 - 1)  # pydantic writes it as a float
    assert bounds["max_tokens"]["anyOf"][0]["maximum"] == 1 << 20
    step = next(p for p in document["paths"]["/v1/fine_tuning/jobs/{job_id}/download"]["get"]["parameters"]
                if p["name"] == "step")
    assert step["schema"]["anyOf"][0]["maximum"] == 2**31 - 1
