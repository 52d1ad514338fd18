"""The training API's routes refuse what they cannot serve with the answer the SDK expects: 401
before a body is read, 400 with a JSON body naming the field (never an empty 400 nor a 409, which
the SDK retries), 404 for another tenant's objects. No co-training worker is needed for any of it."""

from __future__ import annotations

import struct

import pytest

PREFIX = "/tinker/api/v1"


@pytest.fixture(autouse=True)
def no_workers(monkeypatch) -> list:
    """No co-training worker process is started: these requests are refused before one would run."""
    launched: list = []
    for pools in ("pools.LocalPools", "scheduled.ScheduledPools"):
        monkeypatch.setattr(f"tuneforge.services.training_api.{pools}.launch", lambda self, pool: launched.append(pool))
    return launched


def tinker_headers(key: str, **extra: str) -> dict[str, str]:
    return {"X-API-Key": f"tml-{key}", **extra}


def post(world, path: str, key: str, **kwargs):
    return world.http.post(f"{PREFIX}{path}", headers=tinker_headers(key), **kwargs)


def session(world, key: str) -> str:
    answer = post(world, "/create_session", key, json={"tags": [], "sdk_version": "0.38.0", "type": "create_session"})
    assert answer.status_code == 200, answer.text
    return answer.json()["session_id"]


def test_the_key_is_the_tenants_own_behind_tml_and_is_checked_before_the_body(world) -> None:
    assert post(world, "/client/config", world.key_a, json={"sdk_version": "0.38.0"}).json()[
        "pjwt_auth_enabled"] is False
    # without the tml- the key is the same key
    plain = world.http.post(f"{PREFIX}/client/config", headers={"X-API-Key": world.key_a}, json={})
    assert plain.status_code == 200
    missing = world.http.post(f"{PREFIX}/forward_backward", content=b"\x00" * 1000,
                              headers={"Content-Type": "application/x-protobuf"})
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "missing_api_key"
    wrong = world.http.post(f"{PREFIX}/create_session", headers=tinker_headers("tf-not-a-key"), json={})
    assert wrong.status_code == 401


def test_refusals_are_400s_with_a_body_naming_the_field(world) -> None:
    session_id = session(world, world.key_a)
    unknown_base = post(world, "/create_model", world.key_a,
                        json={"session_id": session_id, "model_seq_id": 0, "base_model": "gpt-4o",
                              "lora_config": {"rank": 8}, "type": "create_model"})
    assert unknown_base.status_code == 400 and unknown_base.json()["error"]["param"] == "base_model"
    too_big = post(world, "/create_model", world.key_a,
                   json={"session_id": session_id, "model_seq_id": 0, "base_model": world.base_model,
                         "lora_config": {"rank": 4096}, "type": "create_model"})
    assert too_big.status_code == 400 and too_big.json()["error"]["param"] == "lora_config.rank"
    muon = post(world, "/create_model", world.key_a,
                json={"session_id": session_id, "model_seq_id": 0, "base_model": world.base_model,
                      "optimizer_config": {"type": "dimuon"}, "type": "create_model"})
    assert muon.status_code == 400 and muon.json()["error"]["param"] == "optimizer_config.type"
    garbage = world.http.post(f"{PREFIX}/forward_backward", content=b"\x0a\xff\xff\xff\x0f",
                              headers=tinker_headers(world.key_a, **{"Content-Type": "application/x-protobuf"}))
    assert garbage.status_code == 400 and garbage.json()["error"]["param"] == "body" and garbage.content
    zstd = world.http.post(f"{PREFIX}/forward_backward", content=b"x",
                           headers=tinker_headers(world.key_a, **{"Content-Encoding": "zstd"}))
    assert zstd.status_code == 400 and zstd.json()["error"]["param"] == "content-encoding"


def test_another_tenants_objects_are_not_found(world) -> None:
    mine = session(world, world.key_a)
    for path, body in [
        ("/session_heartbeat", {"session_id": mine, "type": "session_heartbeat"}),
        ("/create_model", {"session_id": mine, "model_seq_id": 0, "base_model": world.base_model}),
        ("/get_info", {"model_id": f"{mine}:train:0"}),
        ("/optim_step", {"model_id": f"{mine}:train:0", "seq_id": 1, "adam_params": {"learning_rate": 1e-4}}),
        ("/retrieve_future", {"request_id": "req-anything", "allow_metadata_only": True}),
        ("/load_weights", {"session_id": mine, "model_seq_id": 1, "path": f"tinker://{mine}:train:0/weights/x"}),
        ("/weights_info", {"tinker_path": f"tinker://{mine}:train:0/weights/x"}),
    ]:
        answer = post(world, path, world.key_b, json=body)
        assert answer.status_code == 404, (path, answer.status_code, answer.text)
    sampler = world.http.get(f"{PREFIX}/samplers/{mine}:sample:0", headers=tinker_headers(world.key_b))
    assert sampler.status_code == 404
    run = world.http.get(f"{PREFIX}/training_runs/{mine}:train:0", headers=tinker_headers(world.key_b))
    assert run.status_code == 404
    finished = world.http.post(f"{PREFIX}/sessions/{mine}/finish", headers=tinker_headers(world.key_b),
                               json={"reason": {"type": "success"}})
    assert finished.status_code == 404
    # the session's own tenant sees it, and a finished session's heartbeat is 410 (the SDK stops beating)
    assert world.http.post(f"{PREFIX}/sessions/{mine}/finish", headers=tinker_headers(world.key_a),
                           json={"reason": {"type": "success"}}).status_code == 200
    assert post(world, "/session_heartbeat", world.key_a, json={"session_id": mine}).status_code == 410


@pytest.mark.parametrize("change, param", [
    ({"num_samples": 0}, "num_samples"),
    ({"prompt": {"chunks": [{"type": "image", "data": "", "format": "png"}]}}, "prompt.chunks[0]"),
    ({"prompt": {"chunks": []}}, "prompt"),
    ({"sampling_params": {"max_tokens": 10 ** 6}}, "sampling_params.max_tokens"),
    ({"sampling_params": {"max_tokens": 4, "stop": {"not": "a list"}}}, "sampling_params.stop"),
    ({"topk_prompt_logprobs": 5}, "topk_prompt_logprobs"),
])
def test_a_sample_request_it_cannot_serve_is_refused_naming_the_field(world, change, param) -> None:
    session_id = session(world, world.key_a)
    created = post(world, "/create_sampling_session", world.key_a,
                   json={"session_id": session_id, "sampling_session_seq_id": 0, "base_model": world.base_model})
    assert created.status_code == 200, created.text
    body = {"sampling_session_id": created.json()["sampling_session_id"], "seq_id": 0, "num_samples": 1,
            "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2, 3]}]},
            "sampling_params": {"max_tokens": 4}, **change}
    answer = post(world, "/asample", world.key_a, json=body)
    assert answer.status_code == 400 and answer.json()["error"]["param"] == param


def test_a_loss_function_the_sdk_names_but_this_platform_does_not_serve_is_refused(world, no_workers) -> None:
    pb = pytest.importorskip("tinker.proto.tinker_public_pb2")
    session_id = session(world, world.key_a)
    created = post(world, "/create_model", world.key_a,
                   json={"session_id": session_id, "model_seq_id": 0, "base_model": world.base_model,
                         "lora_config": {"rank": 8}})
    assert created.status_code == 200, created.text
    message = pb.ForwardBackwardRequest(model_id=created.json()["model_id"], seq_id=1, loss_fn="dro")
    message.data.add().model_input.add().encoded_text.tokens = struct.pack("<2i", 1, 2)
    answer = world.http.post(f"{PREFIX}/forward_backward", content=message.SerializeToString(),
                             headers=tinker_headers(world.key_a, **{"Content-Type": "application/x-protobuf"}))
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "unsupported_loss_fn"
    assert "dro" in answer.json()["error"]["message"]
    assert [pool.base for pool in no_workers] == [world.base_model]  # the model's base got its worker


def test_dot_names_that_no_object_key_can_hold_are_refused_or_not_found_never_a_500(world) -> None:
    mine = session(world, world.key_a)
    created = post(world, "/create_model", world.key_a,
                   json={"session_id": mine, "model_seq_id": 0, "base_model": world.base_model,
                         "lora_config": {"rank": 8}})
    assert created.status_code == 200, created.text
    model_id = created.json()["model_id"]
    for name in (".", ".."):
        saved = post(world, "/save_weights", world.key_a, json={"model_id": model_id, "path": name, "seq_id": 1})
        assert saved.status_code == 400 and saved.json()["error"]["param"] == "path", saved.text
    for path in ("tinker://../weights/x", f"tinker://{model_id}/weights/.."):
        loaded = post(world, "/weights_info", world.key_a, json={"tinker_path": path})
        assert loaded.status_code in (400, 404) and loaded.json()["error"]["param"] == "tinker_path", loaded.text
    for url in ("/training_runs/%2E%2E", "/training_runs/%2E%2E/checkpoints",
                "/training_runs/%2E%2E/checkpoints/weights/x", f"/training_runs/{model_id}/checkpoints/weights/%2E%2E"):
        method = "DELETE" if url.count("/") > 3 else "GET"
        answer = world.http.request(method, f"{PREFIX}{url}", headers=tinker_headers(world.key_a))
        assert answer.status_code in (400, 404), (url, answer.status_code, answer.text)


def test_an_abandoned_sample_is_cancelled_through_cancel_future_and_its_future_says_so(world) -> None:
    config = post(world, "/client/dynamic_config", world.key_a, json={})
    assert config.json()["sample_cancel_enabled"] is True  # the SDK sends cancel_future for abandoned samples
    session_id = session(world, world.key_a)
    created = post(world, "/create_sampling_session", world.key_a,
                   json={"session_id": session_id, "sampling_session_seq_id": 0, "base_model": world.base_model})
    sample = post(world, "/asample", world.key_a, json={
        "sampling_session_id": created.json()["sampling_session_id"], "seq_id": 0, "num_samples": 1,
        "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2, 3]}]}, "sampling_params": {"max_tokens": 4}})
    request_id = sample.json()["request_id"]  # no worker runs here: it waits
    assert post(world, "/cancel_future", world.key_b, json={"request_id": request_id}).status_code == 404
    assert post(world, "/cancel_future", world.key_a, json={"request_id": request_id}).status_code == 200
    answer = post(world, "/retrieve_future", world.key_a, json={"request_id": request_id})
    assert answer.json() == {"error": "cancelled by the client", "category": "user"}
