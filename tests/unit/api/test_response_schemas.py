"""Every operation documents its response body, and real answers of the main routes match the
models their routes declare, field for field and in the same order (checking an answer changes
nothing on the wire)."""

from __future__ import annotations

import io
import json
import time
from typing import Any

from fastapi.routing import APIRoute
from pydantic import BaseModel

from tests.helpers.platform import chat_lines
from tuneforge.api.schemas.base import ObjectRoute
from tuneforge.db.tables import Checkpoint
from tuneforge.serve.budget import Lease, TokenBudget
from tuneforge.serve.params import Completion, Usage


def _documented(document: dict[str, Any], schema: dict[str, Any]) -> bool:
    """A JSON body's schema names its fields: properties, or a $ref to a component that has them."""
    ref = schema.get("$ref")
    if ref is not None:
        schema = document["components"]["schemas"].get(ref.rsplit("/", 1)[-1], {})
    return bool(schema.get("properties"))


def test_every_operation_documents_its_2xx_body(world):
    document = world.http.app.openapi()
    missing = []
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            answers = {code: r for code, r in operation["responses"].items() if code.startswith("2")}
            if not answers:
                missing.append(f"{method.upper()} {path}: no 2xx response")
            for code, response in answers.items():
                content = response.get("content") or {}
                if not content:
                    missing.append(f"{method.upper()} {path} {code}: no body")
                for media_type, entry in content.items():
                    schema = entry.get("schema") or {}
                    good = _documented(document, schema) if media_type == "application/json" else bool(schema)
                    if not good:
                        missing.append(f"{method.upper()} {path} {code} {media_type}: {schema}")
    assert not missing, "operations without a documented response body:\n" + "\n".join(missing)


def _api_routes(routes: list[Any]) -> list[APIRoute]:
    """The app's routes in the order requests are matched, those of included routers too."""
    found = []
    for route in routes:
        included = getattr(route, "original_router", None)  # a router this FastAPI keeps whole
        found += _api_routes(included.routes) if included is not None else [route]
    return [route for route in found if isinstance(route, APIRoute)]


def test_every_api_route_declares_its_response(world):
    """The routers' routes, those outside the reference (/internal, /metrics) too: a model, or a
    response class of their own (file bytes, the Prometheus exposition)."""
    undeclared = []
    routes = [route for route in _api_routes(world.http.app.routes)
              if route.endpoint.__module__.startswith("tuneforge.api.routes")]
    assert len(routes) >= 70
    for route in routes:
        # a checked answer goes out as the route built it: no defaults added, encoded as before
        assert route.response_model is None or isinstance(route, ObjectRoute), route.path
        own_class = getattr(route.response_class, "media_type", "application/json") != "application/json"
        if route.response_model is None and not own_class:
            undeclared.append(f"{sorted(route.methods)} {route.path}")
    assert not undeclared, undeclared


def _declared(world, method: str, path: str) -> type[BaseModel]:
    for route in _api_routes(world.http.app.routes):
        if method in route.methods and route.path_regex.fullmatch(path):
            return route.response_model
    raise AssertionError(f"no route answers {method} {path}")


def _checked(world, response, method: str | None = None, path: str | None = None) -> dict[str, Any]:
    """The answer's body, after checking that its route's model takes it and gives it back unchanged."""
    assert response.status_code == 200, response.text
    request = response.request
    model = _declared(world, method or request.method, path or request.url.path)
    body = response.json()
    again = model.model_validate(body).model_dump(mode="json", exclude_unset=True)
    assert json.dumps(again) == json.dumps(body), model.__name__  # same fields, values and order
    return body


class _Engine:
    """Stands in for the inference engine: every choice answers "hi"."""

    def for_tenant(self, tenant: str, tokens_in_flight: int | None = None) -> _Engine:
        return self

    def reserve(self, max_tokens: int, choices: int = 1, *, param: str = "max_tokens") -> Lease:
        return TokenBudget().reserve("alpha", choices * max_tokens, None)

    def under(self, lease: Lease) -> _Engine:
        return self

    async def acomplete(self, target, prompt, params) -> Completion:  # noqa: ANN001 - the engine's signature
        return Completion("hi", "stop", Usage(prompt_tokens=3, completion_tokens=1))


def test_answers_of_the_main_routes_match_their_declared_models(world):
    http, auth = world.http, world.headers(world.key_a)
    file = _checked(world, http.post("/v1/files", headers=auth, data={"purpose": "fine-tune"},
                                     files={"file": ("train.jsonl", io.BytesIO(chat_lines(20)))}))
    _checked(world, http.get("/v1/files", headers=auth))
    _checked(world, http.get(f"/v1/files/{file['id']}", headers=auth))
    job = _checked(world, http.post("/v1/fine_tuning/jobs", headers=auth,
                                    json={"model": world.base_model, "training_file": file["id"]}))
    assert job["object"] == "fine_tuning.job"
    _checked(world, http.get(f"/v1/fine_tuning/jobs/{job['id']}", headers=auth))
    jobs = _checked(world, http.get("/v1/fine_tuning/jobs", headers=auth))
    assert jobs["data"][0]["id"] == job["id"]
    _checked(world, http.get("/v1/fine_tuning/jobs?metadata[team]=none", headers=auth))
    events = _checked(world, http.get(f"/v1/fine_tuning/jobs/{job['id']}/events", headers=auth))
    assert events["data"]
    with world.platform.db.session() as session:
        session.add(Checkpoint(checkpoint_id="ftckpt-1", job_id=job["id"], step=10, attempt=1, epoch=1,
                               metrics={"step": 10, "train_loss": 1.25}, prefix="p/", created_at=int(time.time())))
        session.commit()
    checkpoints = _checked(world, http.get(f"/v1/fine_tuning/jobs/{job['id']}/checkpoints", headers=auth))
    assert checkpoints["data"][0]["step_number"] == 10
    cancelled = _checked(world, http.post(f"/v1/fine_tuning/jobs/{job['id']}/cancel", headers=auth))
    assert cancelled["status"] == "cancelled"
    models = _checked(world, http.get("/v1/models", headers=auth))
    assert world.base_model in [model["id"] for model in models["data"]]
    _checked(world, http.get(f"/v1/models/{world.base_model}", headers=auth))
    world.platform.inference = _Engine()
    chat = _checked(world, http.post("/v1/chat/completions", headers=auth, json={
        "model": world.base_model, "messages": [{"role": "user", "content": "hello"}], "n": 2}))
    assert chat["choices"][1]["message"]["content"] == "hi"
    _checked(world, http.post("/v1/completions", headers=auth, json={"model": world.base_model, "prompt": "hello"}))
