"""Attack: a JSON Schema as a weapon (`response_format` json_schema, a forced tool's parameters).

Before the fix, answers were checked with jsonschema's default (deprecated) remote resolution: a
`$ref` to a listener on 127.0.0.1 was fetched by the server (past the egress policy), `file://`
refs were opened, a 2 KB schema of 20 chained definitions froze a worker for 45 s (+2.7 GB) and
`{"$ref": "#"}` answered 500. Now each is a 400 naming the field before anything is generated
(serve/json_schema.py), and nothing is ever fetched.

Against the real `tuneforge up` of the suite (two API workers) with the tiny model.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.helpers.attack import MODEL_NAME, LiveServer
from tests.helpers.net import counting_json_server

API_WORKERS = 2
# Bounds, generous for a loaded 2-core CI machine (before the fix: the chained schema held a
# worker 45 s and +2.7 GB; the remote $ref was fetched)
ANSWER_BOUND_S = 3.0  # a 400 from the schema's static checks, before any generation
BYSTANDER_BOUND_S = 1.5
RSS_GROWTH_BOUND_BYTES = 64 * 2**20
WATCH_AFTER_S = 1.0


@pytest.fixture(scope="module")
def listener() -> Iterator[tuple[str, list[str]]]:
    """An HTTP server on 127.0.0.1 that serves a schema and counts every request it gets."""
    with counting_json_server({"type": "object"}) as served:
        yield served


@pytest.fixture(scope="module")
def warm(live: LiveServer) -> LiveServer:
    """Every API worker has loaded the model once, so the watch measures the attack alone."""
    with live.client(live.bystander_key) as client:
        threads = [threading.Thread(target=_chat, args=(client,), kwargs={"max_tokens": 1})
                   for _ in range(4 * API_WORKERS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return live


def _chat(client: httpx.Client, **extra) -> httpx.Response:
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "answer in json"}], **extra}
    return client.post("/v1/chat/completions", json=body)


def _with_schema(schema: dict) -> dict:
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "attack", "schema": schema}},
            "max_tokens": 16, "temperature": 0}


def _forced_tool(parameters: dict) -> dict:
    return {"tools": [{"type": "function", "function": {"name": "f", "parameters": parameters}}],
            "tool_choice": {"type": "function", "function": {"name": "f"}}, "max_tokens": 16, "temperature": 0}


def chained(links: int) -> dict:
    """`links` definitions, each naming the next twice: about 2 KB, 2^links paths."""
    defs = {f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{i + 1}"}, {"$ref": f"#/$defs/d{i + 1}"}]} for i in range(links)}
    defs[f"d{links}"] = {"type": "string"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def attack(live: LiveServer, extra: dict) -> tuple[httpx.Response, float]:
    with live.client(live.attacker_key, timeout_s=300) as client:
        started = time.monotonic()
        answer = _chat(client, **extra)
        return answer, time.monotonic() - started


def _contained(live: LiveServer, watch, answer: httpx.Response, elapsed_s: float, param: str) -> None:
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param
    assert elapsed_s < ANSWER_BOUND_S
    assert live.alive() and not watch.bystander_failures and len(watch.latencies_s) >= 3
    assert watch.bystander_max_s < BYSTANDER_BOUND_S
    assert watch.rss_growth_bytes < RSS_GROWTH_BOUND_BYTES


def test_a_remote_ref_is_400_and_the_listener_never_hears_of_it(warm, listener):
    url, hits = listener
    cases = [(_with_schema({"$ref": f"{url}/schema.json"}), "response_format.json_schema.schema.$ref"),
             (_with_schema({"type": "object", "properties": {"a": {"$ref": f"{url}/a.json#/x"}}}),
              "response_format.json_schema.schema.properties.a.$ref"),
             (_forced_tool({"$ref": f"{url}/tool.json"}), "tools.0.function.parameters.$ref")]
    for extra, param in cases:
        with warm.watch() as watch:
            answer, elapsed_s = attack(warm, extra)
            time.sleep(WATCH_AFTER_S)
        print(f"\nremote $ref ({param}): {answer.status_code} in {elapsed_s:.2f} s, listener hits {len(hits)}; "
              f"{watch.summary()}")
        _contained(warm, watch, answer, elapsed_s, param)
    assert hits == []


def test_a_file_ref_is_400(warm):
    with warm.watch() as watch:
        answer, elapsed_s = attack(warm, _with_schema({"$ref": "file:///etc/passwd"}))
        time.sleep(WATCH_AFTER_S)
    print(f"\nfile:// $ref: {answer.status_code} in {elapsed_s:.2f} s; {watch.summary()}")
    _contained(warm, watch, answer, elapsed_s, "response_format.json_schema.schema.$ref")
    assert answer.json()["error"]["code"] == "schema_ref_not_allowed"


def test_twenty_chained_definitions_are_400_at_once(warm):
    schema = chained(20)
    assert len(json.dumps(schema)) < 2048
    with warm.watch() as watch:
        answers = [attack(warm, _with_schema(schema)) for _ in range(2)]  # one for each worker, likely
        time.sleep(WATCH_AFTER_S)
    print(f"\n20 chained definitions x2: {[a.status_code for a, _ in answers]} in "
          f"{max(s for _, s in answers):.2f} s; {watch.summary()}")
    for answer, elapsed_s in answers:
        _contained(warm, watch, answer, elapsed_s, "response_format.json_schema.schema")
        assert answer.json()["error"]["code"] == "schema_too_large"


@pytest.mark.parametrize(("extra", "param"), [
    (_with_schema({"$ref": "#"}), "response_format.json_schema.schema.$ref"),
    (_with_schema({"type": "object", "properties": {"child": {"$ref": "#"}}}),
     "response_format.json_schema.schema.properties.child.$ref"),
    (_forced_tool({"$ref": "#"}), "tools.0.function.parameters.$ref"),
])
def test_a_recursive_ref_is_400_not_500(warm, extra, param):
    with warm.watch() as watch:
        answer, elapsed_s = attack(warm, extra)
        time.sleep(WATCH_AFTER_S)
    print(f"\nrecursive $ref ({param}): {answer.status_code} in {elapsed_s:.2f} s; {watch.summary()}")
    _contained(warm, watch, answer, elapsed_s, param)
    assert answer.json()["error"]["code"] == "schema_recursive"


def test_a_plain_schema_still_gets_its_answer(warm):
    answer, _elapsed_s = attack(warm, _with_schema({"type": "object"}))
    assert answer.status_code == 200, answer.text
    assert isinstance(json.loads(answer.json()["choices"][0]["message"]["content"]), dict)
