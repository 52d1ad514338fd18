"""The inference routes' bounds on generation: a default max_tokens (capped by the context), a cap
per request, and each tenant's n × max_tokens in flight (per tier, per process) reserved before
anything is queued and given back when the answer is done, streamed or not."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from tests.helpers.platform import make_platform
from tests.unit.api.test_inference import BASE, MESSAGES, adapter_dirs, populate  # noqa: F401 - the fixture
from tuneforge.api.app import create_app
from tuneforge.db.repos import tenants as tenant_repo

DEFAULT_MAX_TOKENS = 5
CAP_TOKENS = 64
STANDARD_TOKENS_IN_FLIGHT = 100


@pytest.fixture
def bounded(tmp_path, database_url, tiny_model_dir, adapter_dirs):  # noqa: F811
    platform = make_platform(tmp_path, database_url, inference_default_max_tokens=DEFAULT_MAX_TOKENS,
                             inference_max_tokens_per_request=CAP_TOKENS,
                             inference_tokens_in_flight_by_tier={"standard": STANDARD_TOKENS_IN_FLIGHT})
    tenants = populate(platform, tiny_model_dir, adapter_dirs)
    http = TestClient(create_app(platform=platform), raise_server_exceptions=False)
    yield platform, http, tenants.keys["acme"]
    http.close()
    platform.db.dispose()


def _chat(http: TestClient, key: str, **extra):  # noqa: ANN202
    return http.post("/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                     json={"model": BASE, "messages": MESSAGES, "temperature": 0} | extra)


def _tenant_id(platform, key: str) -> str:  # noqa: ANN001
    with platform.db.session() as session:
        return tenant_repo.by_api_key(session, key).tenant_id


def test_a_request_without_max_tokens_gets_the_default_and_ignore_eos_cannot_pass_it(bounded):
    _platform, http, key = bounded
    answer = _chat(http, key, ignore_eos=True, n=3)
    assert answer.status_code == 200, answer.text
    assert [c["finish_reason"] for c in answer.json()["choices"]] == ["length"] * 3
    assert answer.json()["usage"]["completion_tokens"] == 3 * DEFAULT_MAX_TOKENS
    legacy = http.post("/v1/completions", headers={"Authorization": f"Bearer {key}"},
                       json={"model": BASE, "prompt": "def f(x):", "ignore_eos": True})
    assert legacy.json()["usage"]["completion_tokens"] == DEFAULT_MAX_TOKENS


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_max_tokens_over_the_cap_answers_400_naming_the_field(bounded, field):
    platform, http, key = bounded
    answer = _chat(http, key, **{field: CAP_TOKENS + 1})
    assert answer.status_code == 400
    assert answer.json()["error"] == {
        "message": f"{field} must be at most {CAP_TOKENS} (this server's limit per choice)",
        "type": "invalid_request_error", "param": field, "code": "max_tokens_too_large"}
    assert platform.inference is None  # refused before the engine exists
    assert _chat(http, key, **{field: CAP_TOKENS}).status_code == 200


def test_n_times_max_tokens_over_the_tiers_bound_answers_400(bounded):
    _platform, http, key = bounded
    answer = _chat(http, key, n=2, max_tokens=51)  # 102 > 100: it could never run
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert (error["param"], error["code"]) == ("max_tokens", "max_tokens_over_budget")
    assert "102 tokens" in error["message"]


def test_tokens_held_by_the_tenants_other_requests_answer_429_with_retry_after(bounded):
    platform, http, key = bounded
    assert _chat(http, key, max_tokens=1).status_code == 200  # the engine exists
    tenant_id = _tenant_id(platform, key)
    held = platform.inference.budget.reserve(tenant_id, 60, None)  # as if its other requests ran
    answer = _chat(http, key, n=2, max_tokens=25)  # 60 + 50 > 100
    assert answer.status_code == 429
    assert answer.json()["error"]["code"] == "tokens_in_flight_exceeded"
    assert float(answer.headers["Retry-After"]) >= 1
    assert _chat(http, key, n=2, max_tokens=20).status_code == 200  # 60 + 40 fits
    held.close()
    assert _chat(http, key, n=2, max_tokens=25).status_code == 200
    assert platform.inference.budget.held_tokens(tenant_id) == 0  # every answer gave its tokens back


def test_a_streamed_answer_gives_its_tokens_back_when_it_ends(bounded):
    platform, http, key = bounded
    with http.stream("POST", "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                     json={"model": BASE, "messages": MESSAGES, "stream": True, "n": 2, "max_tokens": 4}) as answer:
        assert answer.status_code == 200
        lines = [line for line in answer.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    assert platform.inference.budget.held_tokens(_tenant_id(platform, key)) == 0


def test_the_default_max_tokens_ends_where_the_context_does(bounded):
    _platform, http, key = bounded
    context_tokens = 512  # the tiny model's max_position_embeddings
    prompt = [5] * (context_tokens - 3)  # room for 3 tokens, fewer than the default 5
    answer = http.post("/v1/completions", headers={"Authorization": f"Bearer {key}"},
                       json={"model": BASE, "prompt": prompt, "ignore_eos": True})
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"] == {"prompt_tokens": context_tokens - 3, "completion_tokens": 3,
                                      "total_tokens": context_tokens}
    assert answer.json()["choices"][0]["finish_reason"] == "length"
