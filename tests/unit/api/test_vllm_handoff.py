"""The hand-off to vLLM, against a small HTTP server that implements the vLLM endpoints
tuneforge calls (tests/helpers/fake_vllm.py): promoting an adapter to production, or giving it
weight in a route, loads it (its files copied into the shared directory first); deleting it or
taking its traffic away unloads it; requests for it, and for the base, are proxied (plain and
streamed) in the tenant's names; a restarted server gets the adapter back; the server's errors
reach the tenant as stable messages, and a server that will not load an adapter leaves it to the
built-in engine."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from tests.helpers.fake_vllm import FakeVllm
from tests.helpers.platform import make_platform
from tests.helpers.registry import add_adapter_model
from tests.unit.api.test_routes import Fleet, users_of_each_version, version_dirs  # noqa: F401 - fixture
from tuneforge.api.app import create_app
from tuneforge.serve import vllm
from tuneforge.services.serving import base_models as base_model_service
from tuneforge.services.tenancy import tenants as tenant_service

BASE = "tiny-chat"
API_KEY = "vllm-secret"
ON_SERVER = "/adapters"
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture
def handed_off(tmp_path, database_url, tiny_model_dir, version_dirs):  # noqa: F811
    shared = tmp_path / "shared-adapters"
    fake = FakeVllm(base=BASE, adapter_root_on_server=ON_SERVER, local_root=shared, api_key=API_KEY).start()
    platform = make_platform(tmp_path, database_url, vllm_urls={BASE: [fake.url]}, vllm_adapter_dir=shared,
                             vllm_adapter_dir_on_server=ON_SERVER, vllm_api_key=API_KEY)
    keys, models = {}, {}
    with platform.db.session() as session:
        base = base_model_service.add_base_model(session, platform.store, BASE, str(tiny_model_dir),
                                                 platform.settings.home / "hub")
        tenant, keys["acme"] = tenant_service.create_tenant(session, "acme")
        for version in ("v1", "v2"):
            models[version] = add_adapter_model(session, platform.store, tenant, base, version, version_dirs[version])
    http = TestClient(create_app(platform=platform), raise_server_exceptions=False)
    yield platform, http, Fleet(keys, models, {}), fake, shared
    http.close()
    platform.db.dispose()
    fake.stop()


def _auth(fleet: Fleet) -> dict[str, str]:
    return {"Authorization": f"Bearer {fleet.keys['acme']}"}


def _promote(http: TestClient, fleet: Fleet, version: str, *stages: str) -> None:
    for stage in stages:
        response = http.post(f"/v1/models/{fleet.models[version]}/promote", headers=_auth(fleet),
                             json={"stage": stage})
        assert response.status_code == 200, response.text


def _calls(fake: FakeVllm, start: int = 0) -> list[tuple[str, str, object]]:
    return [(seen.method, seen.path, seen.body) for seen in fake.seen[start:]]


def _lora_dir(model_id: str) -> str:
    return vllm._dir_name(model_id)


def test_production_loads_the_adapter_and_its_requests_go_to_vllm(handed_off):
    _platform, http, fleet, fake, shared = handed_off
    v1 = fleet.models["v1"]
    _promote(http, fleet, "v1", "staging")
    assert _calls(fake) == [("GET", "/v1/models", None)]  # staging: nothing to load
    _promote(http, fleet, "v1", "production")
    path = f"{ON_SERVER}/{_lora_dir(v1)}"
    assert _calls(fake, 1) == [("GET", "/v1/models", None),
                               ("POST", "/v1/load_lora_adapter", {"lora_name": v1, "lora_path": path})]
    assert {seen.authorization for seen in fake.seen} == {f"Bearer {API_KEY}"}
    copied = shared / _lora_dir(v1)
    assert (copied / "adapter_config.json").exists() and (copied / "adapter_model.safetensors").exists()

    start = len(fake.seen)
    answer = http.post("/v1/chat/completions", headers=_auth(fleet), json={
        "model": v1, "messages": HI, "max_tokens": 5, "temperature": 0, "user": "u-1", "metadata": {"k": "v"}})
    assert answer.status_code == 200, answer.text
    assert _calls(fake, start) == [("POST", "/v1/chat/completions", {
        "model": v1, "messages": HI, "max_tokens": 5, "temperature": 0.0, "user": "u-1", "stream": False})]
    body = answer.json()
    assert body["model"] == v1 and body["id"].startswith("chatcmpl-") and body["id"] != "chatcmpl-upstream"
    assert body["choices"][0]["message"]["content"] == f"vllm says hi from {v1}"
    assert body["usage"] == {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}  # as the server counted

    # the base itself goes to the server too, under the name it serves it by
    start = len(fake.seen)
    completion = http.post("/v1/completions", headers=_auth(fleet), json={"model": BASE, "prompt": "Once",
                                                                          "max_tokens": 3})
    assert completion.status_code == 200, completion.text
    assert _calls(fake, start) == [("POST", "/v1/completions", {
        "model": BASE, "prompt": "Once", "max_tokens": 3, "stream": False, "echo": False})]
    assert completion.json()["choices"][0]["text"] == f"vllm says hi from {BASE}"


def test_a_streamed_answer_is_relayed_in_the_tenants_names(handed_off):
    _platform, http, fleet, fake, _shared = handed_off
    v1 = fleet.models["v1"]
    _promote(http, fleet, "v1", "staging", "production")
    for include_usage in (False, True):
        start = len(fake.seen)
        request = {"model": v1, "messages": HI, "stream": True}
        if include_usage:
            request["stream_options"] = {"include_usage": True}
        with http.stream("POST", "/v1/chat/completions", headers=_auth(fleet), json=request) as response:
            assert response.status_code == 200
            lines = [line for line in response.iter_lines() if line]
        # usage is always asked of the server (a routed request records it)
        assert _calls(fake, start) == [("POST", "/v1/chat/completions", {
            "model": v1, "messages": HI, "stream": True, "stream_options": {"include_usage": True}})]
        assert lines[-1] == "data: [DONE]"
        events = [json.loads(line[len("data: "):]) for line in lines[:-1]]
        assert {e["model"] for e in events} == {v1}
        assert len({e["id"] for e in events}) == 1 and events[0]["id"] != "chatcmpl-upstream"
        text = "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])
        assert text == f"vllm says hi from {v1}"
        if include_usage:
            assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 5
        else:
            assert all("usage" not in e for e in events)


def test_a_route_loads_its_versions_and_records_what_vllm_served(handed_off):
    _platform, http, fleet, fake, shared = handed_off
    v1, v2 = fleet.models["v1"], fleet.models["v2"]
    created = http.post("/v1/routes", headers=_auth(fleet), json={"name": "ab", "versions": [
        {"model": v1, "weight": 1}, {"model": v2, "weight": 1}]})
    assert created.status_code == 200, created.text
    loads = [seen.body["lora_name"] for seen in fake.requests("/v1/load_lora_adapter")]
    assert sorted(loads) == sorted([v1, v2])

    served = set()
    for user in users_of_each_version(created.json(), 4):
        answer = http.post("/v1/chat/completions", headers=_auth(fleet), json={
            "model": "route:ab", "messages": HI, "user": user}).json()
        assert answer["choices"][0]["message"]["content"] == f"vllm says hi from {answer['model']}"
        served.add(answer["model"])
    assert served == {v1, v2}
    stats = http.get("/v1/routes/ab/stats", headers=_auth(fleet)).json()["data"]
    assert sum(row["requests"] for row in stats) == 8
    assert all(row["usage"]["prompt_tokens"] == 7 * row["requests"] for row in stats)

    # v2 loses its traffic: it is unloaded, and its shared copy removed
    start = len(fake.seen)
    http.post("/v1/routes/ab/promote", headers=_auth(fleet), json={"model": v1})
    assert ("POST", "/v1/unload_lora_adapter", {"lora_name": v2}) in _calls(fake, start)
    assert set(fake.loaded) == {v1}
    assert not (shared / _lora_dir(v2)).exists() and (shared / _lora_dir(v1)).exists()
    # deleting the route unloads v1 too (it is in dev)
    http.delete("/v1/routes/ab", headers=_auth(fleet))
    assert fake.loaded == {}


def test_deleting_a_production_model_unloads_it(handed_off):
    _platform, http, fleet, fake, shared = handed_off
    v1 = fleet.models["v1"]
    _promote(http, fleet, "v1", "staging", "production")
    assert set(fake.loaded) == {v1}
    start = len(fake.seen)
    assert http.delete(f"/v1/models/{v1}", headers=_auth(fleet)).status_code == 200
    assert _calls(fake, start) == [("GET", "/v1/models", None), ("POST", "/v1/unload_lora_adapter",
                                                                 {"lora_name": v1})]
    assert not (shared / _lora_dir(v1)).exists()
    # restored: loaded again
    assert http.post(f"/v1/models/{v1}/restore", headers=_auth(fleet)).status_code == 200
    assert set(fake.loaded) == {v1}


def test_a_restarted_server_gets_the_adapter_back(handed_off):
    platform, http, fleet, fake, _shared = handed_off
    v1 = fleet.models["v1"]
    _promote(http, fleet, "v1", "staging", "production")
    fake.loaded.clear()  # vLLM restarted: its runtime adapters are gone
    start = len(fake.seen)
    answer = http.post("/v1/chat/completions", headers=_auth(fleet), json={"model": v1, "messages": HI})
    assert answer.status_code == 200, answer.text
    assert [(method, path) for method, path, _ in _calls(fake, start)] == [
        ("POST", "/v1/chat/completions"), ("POST", "/v1/load_lora_adapter"), ("POST", "/v1/chat/completions")]

    # the periodic sync does the same without a request
    fake.loaded.clear()
    handoff = vllm.handoff_for(platform)
    with platform.db.session() as session:
        report = handoff.sync(session)
    assert report["loaded"] == [f"{v1}@{fake.url}"] and set(fake.loaded) == {v1}
    # and unloads an adapter of ours that nothing deploys, leaving the operator's own alone
    fake.loaded.update({"ft:tiny-chat:acme:gone:1": "/adapters/x", "operators-own": "/adapters/y"})
    with platform.db.session() as session:
        report = handoff.sync(session)
    assert report["unloaded"] == [f"ft:tiny-chat:acme:gone:1@{fake.url}"]
    assert set(fake.loaded) == {v1, "operators-own"}


@pytest.mark.parametrize("status, text, headers, expected_status, code", [
    (400, '{"object": "error", "message": "This model\'s maximum context length is 2048 tokens. However, you '
          'requested 9000 tokens", "type": "BadRequestError", "code": 400}', {}, 400, "context_length_exceeded"),
    (400, '{"object": "error", "message": "internal detail /srv/vllm/x.py", "code": 400}', {}, 400,
     "request_refused"),
    (503, '{"error": "overloaded"}', {"Retry-After": "7"}, 429, "engine_overloaded"),
    (500, 'Traceback (most recent call last): File "/srv/vllm/engine.py"', {}, 503, "engine_unavailable"),
])
def test_server_errors_reach_the_tenant_as_stable_messages(handed_off, status, text, headers, expected_status, code):
    _platform, http, fleet, fake, _shared = handed_off
    _promote(http, fleet, "v1", "staging", "production")
    fake.fail_next.append((status, text, headers))
    answer = http.post("/v1/chat/completions", headers=_auth(fleet), json={"model": fleet.models["v1"],
                                                                           "messages": HI})
    assert answer.status_code == expected_status, answer.text
    error = answer.json()["error"]
    assert error["code"] == code
    assert "vllm" not in error["message"].lower() and "/srv" not in error["message"]
    assert "request id req_" in error["message"] or code == "engine_overloaded"
    if expected_status == 429:
        assert answer.headers["retry-after"] == "7"


def test_a_server_that_is_down_answers_503_and_an_unloadable_adapter_stays_built_in(handed_off):
    _platform, http, fleet, fake, _shared = handed_off
    v1, v2 = fleet.models["v1"], fleet.models["v2"]
    fake.refuse[v2] = "LoRA rank 64 is greater than max_lora_rank 16."
    _promote(http, fleet, "v2", "staging", "production")
    assert v2 not in fake.loaded
    start = len(fake.seen)
    answer = http.post("/v1/chat/completions", headers=_auth(fleet), json={"model": v2, "messages": HI,
                                                                           "max_tokens": 3, "temperature": 0})
    assert answer.status_code == 200, answer.text
    assert "vllm says" not in answer.json()["choices"][0]["message"]["content"]  # the built-in engine answered
    assert [seen.body["model"] for seen in fake.seen[start:] if seen.path == "/v1/chat/completions"] == []

    _promote(http, fleet, "v1", "staging", "production")
    fake.stop()
    down = http.post("/v1/chat/completions", headers=_auth(fleet), json={"model": v1, "messages": HI})
    assert down.status_code == 503 and down.json()["error"]["code"] == "engine_unavailable"
    assert down.headers["retry-after"]


def test_requests_for_models_not_deployed_stay_on_the_built_in_engine(handed_off):
    _platform, http, fleet, fake, _shared = handed_off
    answer = http.post("/v1/chat/completions", headers=_auth(fleet), json={
        "model": fleet.models["v1"], "messages": HI, "max_tokens": 3, "temperature": 0})
    assert answer.status_code == 200, answer.text
    assert fake.requests("/v1/chat/completions") == []


def test_control_bytes_and_lone_surrogates_from_vllm_reach_the_tenant_escaped(handed_off):
    _platform, http, fleet, fake, _shared = handed_off
    v1 = fleet.models["v1"]
    _promote(http, fleet, "v1", "staging", "production")
    fake.answer_text = "nul\x00 esc\x1b lone\ud800 end"
    expected = "nul\\u0000 esc\\u001b lone\ufffd end"
    answer = http.post("/v1/chat/completions", headers=_auth(fleet), json={"model": v1, "messages": HI})
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] == expected
    with http.stream("POST", "/v1/chat/completions", headers=_auth(fleet),
                     json={"model": v1, "messages": HI, "stream": True}) as response:
        lines = [line for line in response.iter_lines() if line]
    events = [json.loads(line[len("data: "):]) for line in lines[:-1]]
    streamed = "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])
    assert streamed == " " + expected  # the fake streams word by word, each after a space


def test_a_model_graders_judge_on_a_base_with_a_vllm_server_is_asked_there_and_metered(handed_off):
    _platform, http, fleet, fake, _shared = handed_off
    grader = {"type": "label_model", "name": "tone", "model": BASE, "labels": ["vllm", "other"],
              "passing_labels": ["vllm"], "sampling_params": {"max_completions_tokens": 9, "seed": 4},
              "input": [{"role": "user", "content": "Label {{sample.output_text}}"}]}
    start = len(fake.seen)
    answer = http.post("/v1/fine_tuning/alpha/graders/run", headers=_auth(fleet),
                       json={"grader": grader, "model_sample": "hello"})
    assert answer.status_code == 200, answer.text
    ((method, path, body),) = _calls(fake, start)
    assert (method, path, body["model"], body["max_tokens"], body["seed"], body["temperature"]) == \
        ("POST", "/v1/chat/completions", BASE, 9, 4, 0.0)
    assert body["messages"] == [{"role": "user", "content": "Label hello"}]
    assert body["response_format"]["json_schema"]["schema"]["properties"]["result"]["enum"] == ["vllm", "other"]
    # the fake server's answer is plain text, not the JSON verdict: a parse error, its tokens metered
    result = answer.json()
    assert result["reward"] == 0.0 and result["metadata"]["errors"]["model_grader_parse_error"] is True
    assert result["model_grader_token_usage_per_model"] == {BASE: 12}
    (row,) = http.get("/v1/usage", headers=_auth(fleet)).json()["tokens"]
    assert (row["kind"], row["model"], row["prompt_tokens"], row["completion_tokens"]) == ("judge.served", BASE, 7, 5)
