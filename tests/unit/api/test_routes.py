"""/v1/routes: A/B routes between model versions. A routed chat request is answered by the
version the route picked (its own adapter's text), says which in `model` and a header, keeps one
user on one version, and is recorded with its latency and tokens; feedback scores an answer by
its id; promotion shifts the weights; a model whose gates failed cannot take traffic, and a
model that takes traffic cannot be deleted or archived under its route."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.helpers.lora import save_random_lora
from tests.helpers.platform import make_platform
from tests.helpers.registry import add_adapter_model
from tests.unit.api.test_inference import BASE, MESSAGES, _expected_chat_text
from tuneforge.api.app import create_app
from tuneforge.db.tables import FineTunedModel
from tuneforge.serve import routing
from tuneforge.services.serving import base_models as base_model_service
from tuneforge.services.serving import routes as route_service
from tuneforge.services.tenancy import tenants as tenant_service


@dataclass
class Fleet:
    keys: dict[str, str]  # tenant -> key
    models: dict[str, str]  # "v1", "v2", "failed" (acme's), "other" (globex's) -> model id
    adapters: dict[str, Path]


@pytest.fixture(scope="module")
def version_dirs(tmp_path_factory, tiny_model_dir) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("route-adapters")
    return {name: save_random_lora(tiny_model_dir, root / name, seed=seed)
            for name, seed in (("v1", 21), ("v2", 22), ("failed", 23), ("other", 24))}


@pytest.fixture
def fleet(tmp_path, database_url, tiny_model_dir, version_dirs):
    platform = make_platform(tmp_path, database_url)
    keys, models = {}, {}
    with platform.db.session() as session:
        base = base_model_service.add_base_model(session, platform.store, BASE, str(tiny_model_dir),
                                                 platform.settings.home / "hub")
        tenants = {}
        for name in ("acme", "globex"):
            tenants[name], keys[name] = tenant_service.create_tenant(session, name)
        for version, adapter_dir in version_dirs.items():
            passed = version != "failed"
            models[version] = add_adapter_model(
                session, platform.store, tenants["globex" if version == "other" else "acme"], base, version,
                adapter_dir, promotable=passed, gate_report={"passed": passed, "gates": [
                    {"metric": "accuracy", "passed": passed, "reason": "accuracy 0.2 < 0.5"}]})
    http = TestClient(create_app(platform=platform), raise_server_exceptions=False)
    yield platform, http, Fleet(keys, models, dict(version_dirs))
    http.close()
    platform.db.dispose()


def _auth(fleet: Fleet, tenant: str = "acme") -> dict[str, str]:
    return {"Authorization": f"Bearer {fleet.keys[tenant]}"}


def users_of_each_version(route: dict, per_version: int) -> list[str]:
    """User names that the route sends to each of its versions, `per_version` of each (found with
    the routing function itself, so that a test sees every version serve)."""
    versions = [routing.Version(v["model"], v["weight"]) for v in route["versions"]]
    found: dict[str, list[str]] = {v.model: [] for v in versions}
    for number in range(10_000):
        user = f"user-{number}"
        picked = found[routing.pick(route["id"], versions, user).model]
        if len(picked) < per_version:
            picked.append(user)
        if all(len(users) == per_version for users in found.values()):
            return [user for users in found.values() for user in users]
    raise AssertionError("no users found for every version")


def _create(http: TestClient, fleet: Fleet, name: str, weights: dict[str, int]):
    return http.post("/v1/routes", headers=_auth(fleet), json={
        "name": name, "versions": [{"model": fleet.models[v], "weight": w} for v, w in weights.items()]})


def test_create_read_update_and_delete_a_route(fleet):
    _platform, http, models = fleet
    created = _create(http, models, "support", {"v1": 90, "v2": 10})
    assert created.status_code == 200, created.text
    route = created.json()
    assert route["object"] == "route" and route["id"].startswith("route_")
    assert route["name"] == "support" and route["model"] == "route:support"
    assert route["versions"] == [{"model": models.models["v1"], "weight": 90, "share": 0.9},
                                 {"model": models.models["v2"], "weight": 10, "share": 0.1}]
    assert http.get("/v1/routes/support", headers=_auth(models)).json() == route
    assert [r["name"] for r in http.get("/v1/routes", headers=_auth(models)).json()["data"]] == ["support"]
    # another tenant sees nothing of it
    assert http.get("/v1/routes/support", headers=_auth(models, "globex")).status_code == 404
    assert http.get("/v1/routes", headers=_auth(models, "globex")).json()["data"] == []

    changed = http.patch("/v1/routes/support", headers=_auth(models), json={"versions": [
        {"model": models.models["v1"], "weight": 1}, {"model": models.models["v2"], "weight": 3}]})
    assert changed.status_code == 200, changed.text
    assert [(v["weight"], v["share"]) for v in changed.json()["versions"]] == [(1, 0.25), (3, 0.75)]
    assert _create(http, models, "support", {"v1": 1}).json()["error"]["code"] == "route_exists"

    deleted = http.delete("/v1/routes/support", headers=_auth(models))
    assert deleted.json() == {"id": route["id"], "object": "route", "name": "support", "deleted": True}
    assert http.get("/v1/routes/support", headers=_auth(models)).json()["error"]["code"] == "route_not_found"


@pytest.mark.parametrize("versions, status, param, code", [
    ([{"model": "ft:nope", "weight": 1}], 404, "versions.0.model", "model_not_found"),
    ([{"model": "@other", "weight": 1}], 404, "versions.0.model", "model_not_found"),
    ([{"model": "@v1", "weight": 5}, {"model": "@failed", "weight": 5}], 409, "versions.1.model", "gates_failed"),
    ([{"model": "@v1", "weight": 0}], 400, "versions", None),
    ([{"model": "@v1", "weight": 1}, {"model": "@v1", "weight": 2}], 400, "versions.1.model", None),
    ([{"model": "route:x", "weight": 1}], 400, "versions.0.model", None),
    ([{"model": "@v1", "weight": -1}], 400, "versions.0.weight", None),
    ([], 400, "versions", None),
])
def test_a_version_that_may_not_take_traffic_is_refused_naming_it(fleet, versions, status, param, code):
    _platform, http, models = fleet
    body = {"name": "checked", "versions": [
        {**v, "model": models.models[v["model"][1:]] if v["model"].startswith("@") else v["model"]}
        for v in versions]}
    response = http.post("/v1/routes", headers=_auth(models), json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param
    if code:
        assert error["code"] == code
    assert http.get("/v1/routes/checked", headers=_auth(models)).status_code == 404


def test_bad_route_names_are_refused(fleet):
    _platform, http, models = fleet
    for name in ("", "-lead", "has space", "a/b", "x" * 65):
        response = http.post("/v1/routes", headers=_auth(models), json={
            "name": name, "versions": [{"model": models.models["v1"], "weight": 1}]})
        assert response.status_code == 400, (name, response.text)


def test_a_routed_request_is_answered_by_the_picked_version_and_recorded(fleet, tiny_model_dir):
    platform, http, models = fleet
    created = _create(http, models, "ab", {"v1": 50, "v2": 50})
    assert created.status_code == 200
    expected = {models.models[v]: _expected_chat_text(tiny_model_dir, models.adapters[v], 8) for v in ("v1", "v2")}
    served: dict[str, str] = {}
    for user in users_of_each_version(created.json(), 2):
        for _ in range(2):
            response = http.post("/v1/chat/completions", headers=_auth(models), json={
                "model": "route:ab", "messages": MESSAGES, "max_tokens": 8, "temperature": 0, "user": user})
            assert response.status_code == 200, response.text
            body = response.json()
            version = body["model"]
            assert response.headers["x-tuneforge-model"] == version
            assert response.headers["x-tuneforge-route"] == "ab"
            text, prompt_tokens, completion_tokens = expected[version]
            assert body["choices"][0]["message"]["content"] == text  # that version's own adapter answered
            assert body["usage"]["completion_tokens"] == completion_tokens
            assert served.setdefault(user, version) == version  # sticky: one user, one version
    assert set(served.values()) == set(expected), served

    stats = http.get("/v1/routes/ab/stats", headers=_auth(models)).json()
    assert stats["object"] == "route.stats" and stats["route"] == "ab"
    by_model = {row["model"]: row for row in stats["data"]}
    assert list(by_model) == [models.models["v1"], models.models["v2"]]
    for version, row in by_model.items():
        requests = 2 * sum(1 for v in served.values() if v == version)
        assert row["requests"] == requests and row["errors"] == 0 and row["weight"] == 50
        assert row["usage"] == {"prompt_tokens": expected[version][1] * requests,
                                "completion_tokens": expected[version][2] * requests}
        assert 0 < row["latency_ms"]["p50"] <= row["latency_ms"]["p95"] <= row["latency_ms"]["p99"]
        assert row["feedback"] == {"count": 0, "mean": None}


def test_feedback_scores_an_answer_by_its_id(fleet):
    _platform, http, models = fleet
    assert _create(http, models, "fb", {"v1": 1}).status_code == 200
    ids = []
    for _ in range(3):
        answer = http.post("/v1/chat/completions", headers=_auth(models), json={
            "model": "route:fb", "messages": MESSAGES, "max_tokens": 2}).json()
        ids.append(answer["id"])
    for response_id, score in zip(ids, (1, 0, 1)):
        given = http.post("/v1/routes/fb/feedback", headers=_auth(models),
                          json={"response_id": response_id, "score": score})
        assert given.status_code == 200, given.text
        assert given.json()["model"] == models.models["v1"]
    # a later score replaces the earlier one
    http.post("/v1/routes/fb/feedback", headers=_auth(models), json={"response_id": ids[1], "score": 0.5})
    [row] = http.get("/v1/routes/fb/stats", headers=_auth(models)).json()["data"]
    assert row["requests"] == 3
    assert row["feedback"] == {"count": 3, "mean": round((1 + 0.5 + 1) / 3, 4)}

    unknown = http.post("/v1/routes/fb/feedback", headers=_auth(models), json={"response_id": "chatcmpl-x",
                                                                               "score": 1})
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "response_id"
    # another tenant cannot score this tenant's answers (its route of the same name is not this one)
    foreign = http.post("/v1/routes/fb/feedback", headers=_auth(models, "globex"),
                        json={"response_id": ids[0], "score": -1})
    assert foreign.status_code == 404
    too_big = http.post("/v1/routes/fb/feedback", headers=_auth(models), json={"response_id": ids[0], "score": 1e9})
    assert too_big.status_code == 400 and too_big.json()["error"]["param"] == "score"


def test_a_streamed_routed_request_is_recorded_when_it_ends(fleet):
    _platform, http, models = fleet
    assert _create(http, models, "streamed", {"v2": 3}).status_code == 200
    with http.stream("POST", "/v1/chat/completions", headers=_auth(models), json={
            "model": "route:streamed", "messages": MESSAGES, "max_tokens": 6, "stream": True,
            "stream_options": {"include_usage": True}}) as response:
        assert response.status_code == 200
        assert response.headers["x-tuneforge-model"] == models.models["v2"]
        lines = [line for line in response.iter_lines() if line]
    events = [json.loads(line[len("data: "):]) for line in lines[:-1]]
    assert {e["model"] for e in events} == {models.models["v2"]}
    usage = events[-1]["usage"]
    deadline = time.monotonic() + 10
    while True:  # the record is written by a worker thread once the stream has ended
        [row] = http.get("/v1/routes/streamed/stats", headers=_auth(models)).json()["data"]
        if row["requests"] or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert row["requests"] == 1 and row["errors"] == 0
    assert row["usage"] == {"prompt_tokens": usage["prompt_tokens"], "completion_tokens": usage["completion_tokens"]}
    assert row["first_token_ms_mean"] is not None and row["first_token_ms_mean"] <= row["latency_ms"]["mean"]


def test_promotion_shifts_the_weights_and_guards_the_models_in_use(fleet):
    _platform, http, models = fleet
    assert _create(http, models, "rollout", {"v1": 90, "v2": 10}).status_code == 200
    half = http.post("/v1/routes/rollout/promote", headers=_auth(models), json={"model": models.models["v2"],
                                                                                "weight": 50})
    assert half.status_code == 200, half.text
    assert [(v["model"], v["weight"]) for v in half.json()["versions"]] == [
        (models.models["v1"], 50), (models.models["v2"], 50)]

    # v2 takes traffic: it cannot be deleted or archived under the route
    refused = http.delete(f"/v1/models/{models.models['v2']}", headers=_auth(models))
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "model_in_route"
    archived = http.post(f"/v1/models/{models.models['v2']}/promote", headers=_auth(models),
                         json={"stage": "archived"})
    assert archived.status_code == 409 and archived.json()["error"]["code"] == "model_in_route"

    whole = http.post("/v1/routes/rollout/promote", headers=_auth(models), json={"model": models.models["v2"]})
    assert [(v["model"], v["weight"]) for v in whole.json()["versions"]] == [
        (models.models["v1"], 0), (models.models["v2"], 100)]
    # v1 takes no traffic any more: it may go
    assert http.delete(f"/v1/models/{models.models['v1']}", headers=_auth(models)).status_code == 200
    for _ in range(3):
        answer = http.post("/v1/chat/completions", headers=_auth(models), json={
            "model": "route:rollout", "messages": MESSAGES, "max_tokens": 2})
        assert answer.json()["model"] == models.models["v2"]

    failed = http.post("/v1/routes/rollout/promote", headers=_auth(models), json={"model": models.models["failed"],
                                                                                  "weight": 10})
    assert failed.status_code == 409 and failed.json()["error"]["code"] == "gates_failed"
    assert http.post("/v1/routes/rollout/promote", headers=_auth(models), json={
        "model": models.models["v2"], "weight": 0}).status_code == 400


def test_a_model_an_admin_let_into_staging_despite_its_gates_may_take_traffic(fleet):
    platform, http, models = fleet
    with platform.db.session() as session:
        row = session.query(FineTunedModel).filter_by(model_id=models.models["failed"]).one()
        row.stage = "staging"
    assert _create(http, models, "override", {"failed": 1}).status_code == 200


def test_routes_are_used_as_models_only_by_their_tenant(fleet):
    _platform, http, models = fleet
    assert _create(http, models, "mine", {"v1": 1}).status_code == 200
    response = http.post("/v1/chat/completions", headers=_auth(models, "globex"), json={
        "model": "route:mine", "messages": MESSAGES, "max_tokens": 2})
    assert response.status_code == 404 and response.json()["error"]["code"] == "route_not_found"


def test_apportioning_keeps_the_proportions_in_whole_numbers():
    assert route_service._apportion(50, [90, 10]) == [45, 5]
    assert route_service._apportion(10, [1, 1, 1]) == [4, 3, 3]
    assert route_service._apportion(0, [3, 4]) == [0, 0]
    assert sum(route_service._apportion(99, [7, 13, 29, 1])) == 99


def test_choose_splits_by_weight_and_keeps_users(fleet):
    platform, http, models = fleet
    assert _create(http, models, "split", {"v1": 80, "v2": 20}).status_code == 200
    with platform.db.session() as session:
        tenant_id = session.query(FineTunedModel).filter_by(model_id=models.models["v1"]).one().tenant_id
        picks = [route_service.choose(session, tenant_id, "split", None).model for _ in range(2000)]
        share = picks.count(models.models["v1"]) / len(picks)
        assert abs(share - 0.8) < 0.04, share
        users = {f"user-{i}": route_service.choose(session, tenant_id, "split", f"user-{i}").model for i in range(50)}
        for _ in range(3):
            assert {u: route_service.choose(session, tenant_id, "split", u).model for u in users} == users
