"""/v1/chat/completions and /v1/completions: two tenants' fine-tuned models served
from one base load, each answering with its own adapter's output; another
tenant's model is not found; bad parameters answer 400 naming the parameter;
the official `openai` SDK (plain and streaming) against a real server."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
from fastapi.testclient import TestClient

from tests.helpers.lora import greedy_ids, reference_model, save_random_lora
from tests.helpers.net import free_port
from tests.helpers.platform import make_platform
from tuneforge.api.app import create_app
from tuneforge.db.tables import FineTunedModel, Job
from tuneforge.domain.job_config import JobRequest
from tuneforge.serve.constrained import INVALID, json_prefix
from tuneforge.server import ControlPlane
from tuneforge.services.context import Platform
from tuneforge.services.serving import base_models as base_model_service
from tuneforge.services.tenancy import tenants as tenant_service
from tuneforge.settings import Settings
from tuneforge.storage import layout

BASE = "tiny-chat"
MESSAGES = [{"role": "system", "content": "You answer with a code."},
            {"role": "user", "content": "What is the code for load_data?"}]


@dataclass
class Tenants:
    keys: dict[str, str]  # tenant name -> API key
    models: dict[str, str]  # tenant name -> its fine-tuned model id
    adapters: dict[str, Path]


@pytest.fixture(scope="module")
def adapter_dirs(tmp_path_factory, tiny_model_dir) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tenant-adapters")
    return {"acme": save_random_lora(tiny_model_dir, root / "acme", seed=11),
            "globex": save_random_lora(tiny_model_dir, root / "globex", seed=12, rank=8)}


def populate(platform: Platform, model_dir: Path, adapter_dirs: dict[str, Path]) -> Tenants:
    """The base model, and per tenant a key and a fine-tuned model whose adapter is in the store."""
    keys, models = {}, {}
    now = int(time.time())
    with platform.db.session() as session:
        base = base_model_service.add_base_model(session, platform.store, BASE, str(model_dir),
                                                 platform.settings.home / "hub")
        for name, adapter_dir in adapter_dirs.items():
            tenant, keys[name] = tenant_service.create_tenant(session, name)
            job_id = f"ftjob-{name}"
            session.add(Job(job_id=job_id, tenant_id=tenant.tenant_id, model=BASE, base_model_sha256=base.sha256,
                            training_file="file-train", status="succeeded", seed=0,
                            request=JobRequest(model=BASE, training_file="file-train"),
                            request_hash="0" * 64, created_at=now))
            session.flush()
            prefix = layout.artifact_prefix(tenant.tenant_id, job_id, "adapter")
            platform.store.upload_dir(adapter_dir, prefix)
            models[name] = f"ft:{BASE}:{name}::{job_id[-6:]}"
            session.add(FineTunedModel(model_id=models[name], tenant_id=tenant.tenant_id, job_id=job_id,
                                       base_model=BASE, base_model_sha256=base.sha256, artifact_prefix=prefix,
                                       created_at=now, artifact_kind="adapter"))
    return Tenants(keys, models, dict(adapter_dirs))


@pytest.fixture
def served(tmp_path, database_url, tiny_model_dir, adapter_dirs):
    platform = make_platform(tmp_path, database_url)
    tenants = populate(platform, tiny_model_dir, adapter_dirs)
    http = TestClient(create_app(platform=platform), raise_server_exceptions=False)
    yield platform, http, tenants
    http.close()
    platform.db.dispose()


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _expected_chat_text(model_dir: Path, adapter_dir: Path | None, max_tokens: int) -> tuple[str, int, int]:
    """(text, prompt tokens, completion tokens) of greedy decoding with transformers itself."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rendered = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    prompt_ids = tokenizer(rendered, add_special_tokens=False)["input_ids"]
    ids = greedy_ids(reference_model(model_dir, adapter_dir), prompt_ids, max_tokens, tokenizer.eos_token_id)
    return tokenizer.decode(ids, skip_special_tokens=True), len(prompt_ids), len(ids)


def test_each_tenant_gets_its_own_adapter_from_one_base_load(served, tiny_model_dir):
    platform, http, tenants = served
    answers = {}
    for name in ("acme", "globex", "acme"):
        response = http.post("/v1/chat/completions", headers=_auth(tenants.keys[name]), json={
            "model": tenants.models[name], "messages": MESSAGES, "max_tokens": 12, "temperature": 0})
        assert response.status_code == 200, response.text
        body = response.json()
        text, prompt_tokens, completion_tokens = _expected_chat_text(tiny_model_dir, tenants.adapters[name], 12)
        assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
        assert body["model"] == tenants.models[name]
        assert abs(body["created"] - time.time()) < 60
        choice = body["choices"][0]
        assert choice["message"] == {"role": "assistant", "content": text, "refusal": None}
        assert choice["index"] == 0 and choice["logprobs"] is None
        assert choice["finish_reason"] == ("length" if completion_tokens == 12 else "stop")
        assert body["usage"] == {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                                 "total_tokens": prompt_tokens + completion_tokens}
        answers[name] = text
    assert answers["acme"] != answers["globex"]

    base = http.post("/v1/chat/completions", headers=_auth(tenants.keys["globex"]), json={
        "model": BASE, "messages": MESSAGES, "max_tokens": 12, "temperature": 0}).json()
    assert base["choices"][0]["message"]["content"] == _expected_chat_text(tiny_model_dir, None, 12)[0]
    stats = platform.inference.stats()
    assert (stats["base_loads"], stats["adapter_loads"], stats["adapter_evictions"]) == (1, 2, 0)


def test_completions_prompt_stop_and_length(served):
    _platform, http, tenants = served
    headers = _auth(tenants.keys["acme"])
    request = {"model": tenants.models["acme"], "prompt": "def load_data(path):", "temperature": 0}
    long = http.post("/v1/completions", headers=headers, json=request | {"max_tokens": 30}).json()
    assert long["object"] == "text_completion" and long["id"].startswith("cmpl-")
    choice = long["choices"][0]
    assert (choice["index"], choice["logprobs"], choice["finish_reason"]) == (0, None, "length")
    assert long["usage"]["completion_tokens"] == 30 and len(choice["text"]) > 12

    stop = choice["text"][8:11]
    cut = http.post("/v1/completions", headers=headers, json=request | {"max_tokens": 30, "stop": [stop]}).json()
    assert cut["choices"][0]["text"] == choice["text"][:choice["text"].index(stop)]
    assert cut["choices"][0]["finish_reason"] == "stop"

    short = http.post("/v1/completions", headers=headers, json=request | {"max_tokens": 4, "echo": True}).json()
    assert short["choices"][0]["text"].startswith("def load_data(path):")
    assert short["usage"]["completion_tokens"] == 4
    assert choice["text"].startswith(short["choices"][0]["text"][len("def load_data(path):"):])


def test_another_tenants_model_is_not_found_exactly_like_a_missing_one(served):
    platform, http, tenants = served
    theirs = http.post("/v1/chat/completions", headers=_auth(tenants.keys["globex"]),
                       json={"model": tenants.models["acme"], "messages": MESSAGES})
    missing = http.post("/v1/chat/completions", headers=_auth(tenants.keys["globex"]),
                        json={"model": "ft:tiny-chat:nobody::abc", "messages": MESSAGES})
    for response, name in ((theirs, tenants.models["acme"]), (missing, "ft:tiny-chat:nobody::abc")):
        assert response.status_code == 404
        assert response.json() == {"error": {"message": f"The model '{name}' does not exist",
                                             "type": "invalid_request_error", "param": "model",
                                             "code": "model_not_found"}}
    completion = http.post("/v1/completions", headers=_auth(tenants.keys["globex"]),
                           json={"model": tenants.models["acme"], "prompt": "x"})
    assert completion.status_code == 404 and completion.json()["error"]["code"] == "model_not_found"
    assert platform.inference is None  # nothing was loaded for any of them
    assert http.post("/v1/chat/completions", json={"model": BASE, "messages": MESSAGES}).status_code == 401


CHAT_ERRORS = [
    ({"messages": None}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "messages.0.role"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages.0.content"),
    ({"messages": [{"role": "user"}]}, "messages.0.content"),
    ({"temperature": 2.5}, "temperature"),
    ({"temperature": -0.1}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"n": 9}, "n"),
    ({"n": 0}, "n"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_completion_tokens": -3}, "max_completion_tokens"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"stop": 7}, "stop"),
    ({"stop": [""]}, "stop"),
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"tools": [{"type": "function", "function": {"name": "f g"}}]}, "tools.0.function.name"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"reasoning_effort": "low"}, "reasoning_effort"),
    ({"model": None}, "model"),
]


@pytest.mark.parametrize(("change", "param"), CHAT_ERRORS, ids=[p for _c, p in CHAT_ERRORS])
def test_bad_chat_parameters_answer_400_naming_the_parameter(served, change, param):
    platform, http, tenants = served
    body = {"model": tenants.models["acme"], "messages": MESSAGES} | change
    body = {k: v for k, v in body.items() if v is not None}
    response = http.post("/v1/chat/completions", headers=_auth(tenants.keys["acme"]), json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert platform.inference is None  # rejected before any model was loaded


def test_bad_completion_prompts_answer_400(served):
    platform, http, tenants = served
    headers, model = _auth(tenants.keys["acme"]), tenants.models["acme"]
    for prompt in (["one", "two"], {"text": "x"}, [3, "x"], []):
        response = http.post("/v1/completions", headers=headers, json={"model": model, "prompt": prompt})
        assert response.status_code == 400 and response.json()["error"]["param"] == "prompt", prompt
    for change, param in (({"best_of": 3}, "best_of"), ({"suffix": "end"}, "suffix"), ({"logprobs": 6}, "logprobs"),
                          ({"logprobs": -1}, "logprobs"), ({"logprobs": 2, "echo": True}, "logprobs")):
        response = http.post("/v1/completions", headers=headers, json={"model": model, "prompt": "x"} | change)
        assert response.status_code == 400 and response.json()["error"]["param"] == param
    too_long = http.post("/v1/completions", headers=headers, json={"model": model, "prompt": "the data " * 400})
    assert too_long.status_code == 400
    assert too_long.json()["error"]["param"] == "prompt"
    assert too_long.json()["error"]["code"] == "context_length_exceeded"
    out_of_vocabulary = http.post("/v1/completions", headers=headers, json={"model": model, "prompt": [1, 10 ** 6]})
    assert out_of_vocabulary.status_code == 400 and out_of_vocabulary.json()["error"]["param"] == "prompt"
    assert platform.inference.stats()["base_loads"] == 1


def test_streamed_chat_is_the_same_text_in_server_sent_events(served):
    _platform, http, tenants = served
    body = {"model": tenants.models["globex"], "messages": MESSAGES, "max_tokens": 20, "temperature": 0}
    whole = http.post("/v1/chat/completions", headers=_auth(tenants.keys["globex"]), json=body).json()
    with http.stream("POST", "/v1/chat/completions", headers=_auth(tenants.keys["globex"]),
                     json=body | {"stream": True, "stream_options": {"include_usage": True}}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    events = [json.loads(line[len("data: "):]) for line in lines[:-1]]
    assert {e["object"] for e in events} == {"chat.completion.chunk"}
    assert len({e["id"] for e in events}) == 1
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])
    assert content == whole["choices"][0]["message"]["content"]
    assert events[-2]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    assert events[-1]["choices"] == [] and events[-1]["usage"] == whole["usage"]


def test_the_openai_sdk_works_unchanged_against_a_real_server(tmp_path, database_url, tiny_model_dir, adapter_dirs):
    settings = Settings(home=tmp_path / "home", database_url=database_url, port=free_port())
    plane = ControlPlane(settings, run_scheduler=False).start_in_background()
    try:
        tenants = populate(plane.platform, tiny_model_dir, adapter_dirs)
        acme = openai.OpenAI(base_url=f"{plane.url}/v1", api_key=tenants.keys["acme"], max_retries=0)
        model = tenants.models["acme"]
        chat = acme.chat.completions.create(model=model, messages=MESSAGES, max_tokens=10, temperature=0)
        expected, prompt_tokens, completion_tokens = _expected_chat_text(tiny_model_dir, adapter_dirs["acme"], 10)
        assert chat.choices[0].message.content == expected
        assert chat.choices[0].message.role == "assistant"
        assert chat.usage.prompt_tokens == prompt_tokens and chat.usage.completion_tokens == completion_tokens

        stream = acme.chat.completions.create(model=model, messages=MESSAGES, max_tokens=10, temperature=0,
                                              stream=True)
        chunks = list(stream)
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected
        assert chunks[-1].choices[0].finish_reason == chat.choices[0].finish_reason

        completion = acme.completions.create(model=model, prompt="def load_data(path):", max_tokens=6,
                                             temperature=0)
        assert completion.choices[0].finish_reason in ("stop", "length")
        assert completion.usage.completion_tokens <= 6 and completion.choices[0].text
        streamed = acme.completions.create(model=model, prompt="def load_data(path):", max_tokens=6,
                                           temperature=0, stream=True)
        assert "".join(c.choices[0].text for c in streamed) == completion.choices[0].text

        globex = openai.OpenAI(base_url=f"{plane.url}/v1", api_key=tenants.keys["globex"], max_retries=0)
        with pytest.raises(openai.NotFoundError) as not_found:
            globex.chat.completions.create(model=model, messages=MESSAGES)
        assert not_found.value.code == "model_not_found"
        # n choices: greedy, all the same text; the prompt counted once in the usage
        several = acme.chat.completions.create(model=model, messages=MESSAGES, max_tokens=10, temperature=0, n=3)
        assert [c.index for c in several.choices] == [0, 1, 2]
        assert {c.message.content for c in several.choices} == {expected}
        assert several.usage.prompt_tokens == chat.usage.prompt_tokens
        assert several.usage.completion_tokens == 3 * chat.usage.completion_tokens
        # sampled with a seed: choice i is what seed + i gives alone
        sampled = acme.chat.completions.create(model=model, messages=MESSAGES, max_tokens=8, seed=5, n=2)
        alone = [acme.chat.completions.create(model=model, messages=MESSAGES, max_tokens=8, seed=seed)
                 .choices[0].message.content for seed in (5, 6)]
        assert [c.message.content for c in sampled.choices] == alone
        streamed_n = list(acme.chat.completions.create(model=model, messages=MESSAGES, max_tokens=10,
                                                       temperature=0, n=2, stream=True,
                                                       stream_options={"include_usage": True}))
        for index in (0, 1):
            assert "".join(c.choices[0].delta.content or "" for c in streamed_n
                           if c.choices and c.choices[0].index == index) == expected
        assert streamed_n[-1].usage.completion_tokens == 2 * chat.usage.completion_tokens
        texts = acme.completions.create(model=model, prompt="def load_data(path):", max_tokens=6, temperature=0,
                                        n=2)
        assert [c.text for c in texts.choices] == [completion.choices[0].text] * 2
        # log probabilities: greedy, so each token is its position's likeliest
        scored = acme.chat.completions.create(model=model, messages=MESSAGES, max_tokens=10, temperature=0,
                                              logprobs=True, top_logprobs=3)
        content = scored.choices[0].logprobs.content
        assert "".join(entry.token for entry in content) == scored.choices[0].message.content == expected
        for entry in content:
            assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
            assert entry.top_logprobs[0].token == entry.token and entry.top_logprobs[0].logprob == entry.logprob
            assert entry.bytes == list(entry.token.encode())
        streamed_scores = [e for c in acme.chat.completions.create(
            model=model, messages=MESSAGES, max_tokens=10, temperature=0, logprobs=True, top_logprobs=3,
            stream=True) if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
        assert [(e.token, e.logprob) for e in streamed_scores] == [(e.token, e.logprob) for e in content]
        assert chat.choices[0].logprobs is None  # not asked: none
        # the legacy completions' shape: tokens, their log probabilities, rivals by text, offsets
        legacy = acme.completions.create(model=model, prompt="def load_data(path):", max_tokens=6, temperature=0,
                                         logprobs=2).choices[0]
        assert legacy.text == completion.choices[0].text and "".join(legacy.logprobs.tokens) == legacy.text
        assert len(legacy.logprobs.token_logprobs) == len(legacy.logprobs.tokens) == len(legacy.logprobs.top_logprobs)
        offsets = [0]
        for token in legacy.logprobs.tokens[:-1]:
            offsets.append(offsets[-1] + len(token))
        assert legacy.logprobs.text_offset == offsets
        for token, logprob, top in zip(legacy.logprobs.tokens, legacy.logprobs.token_logprobs,
                                       legacy.logprobs.top_logprobs):
            assert logprob <= 0 and top[token] == logprob and 1 <= len(top) <= 3  # greedy: the likeliest
            assert max(top.values()) == logprob
        streamed_legacy = [c.choices[0].logprobs for c in acme.completions.create(
            model=model, prompt="def load_data(path):", max_tokens=6, temperature=0, logprobs=2, stream=True)
            if c.choices and c.choices[0].logprobs]
        assert [t for part in streamed_legacy for t in part.tokens] == legacy.logprobs.tokens
        assert [o for part in streamed_legacy for o in part.text_offset] == legacy.logprobs.text_offset
        assert acme.completions.create(model=model, prompt="def load_data(path):", max_tokens=6,
                                       temperature=0).choices[0].logprobs is None
        # JSON mode: the output is a JSON object, whatever the (random-weight) model would say
        ask_json = [{"role": "user", "content": "Answer in JSON: what is the code for velmorix?"}]
        for seed in (1, 2, 3):
            shaped = acme.chat.completions.create(model=model, messages=ask_json, max_tokens=48, seed=seed,
                                                  response_format={"type": "json_object"})
            text = shaped.choices[0].message.content
            if shaped.choices[0].finish_reason == "stop":
                assert isinstance(json.loads(text), dict), text
            else:  # cut by max_tokens: still the start of an object
                assert json_prefix(text) != INVALID, text
        with pytest.raises(openai.BadRequestError) as bad:  # OpenAI's rule: the messages say JSON
            acme.chat.completions.create(model=model, messages=MESSAGES, response_format={"type": "json_object"})
        assert bad.value.param == "messages"
        # json_schema: the object is checked, and drawn again when it does not match
        loose = {"type": "json_schema", "json_schema": {"name": "any_object", "schema": {"type": "object"}}}
        matched = acme.chat.completions.create(model=model, messages=ask_json, max_tokens=48, seed=1,
                                               response_format=loose)
        assert isinstance(json.loads(matched.choices[0].message.content), dict)
        strict = {"type": "json_schema", "json_schema": {"name": "code", "strict": True, "schema": {
            "type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"}},
            "required": ["code"], "additionalProperties": False}}}
        with pytest.raises(openai.UnprocessableEntityError) as unmet:  # this random model never writes one
            acme.chat.completions.create(model=model, messages=ask_json, max_tokens=32, seed=1,
                                         response_format=strict)
        assert unmet.value.code == "response_format_unsatisfied" and "3 attempt(s)" in unmet.value.message
        broken = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}}
        with pytest.raises(openai.BadRequestError) as bad:
            acme.chat.completions.create(model=model, messages=ask_json, response_format=broken)
        assert bad.value.param == "response_format.json_schema.schema"
        with pytest.raises(openai.BadRequestError) as bad:
            acme.chat.completions.create(model=model, messages=ask_json, response_format=loose, stream=True)
        assert bad.value.param == "stream"
        # tools: a forced call's arguments are one JSON object matching the function's parameters
        lookup = {"type": "function", "function": {"name": "lookup_code", "parameters": {
            "type": "object", "properties": {"key": {"type": "string"}}}}}
        forced = acme.chat.completions.create(
            model=model, messages=ask_json, max_tokens=48, seed=1, tools=[lookup],
            tool_choice={"type": "function", "function": {"name": "lookup_code"}})
        [call] = forced.choices[0].message.tool_calls
        assert forced.choices[0].finish_reason == "tool_calls" and forced.choices[0].message.content is None
        assert call.function.name == "lookup_code" and isinstance(json.loads(call.function.arguments), dict)
        assert call.id.startswith("call_") and call.type == "function"
        streamed_call = [c for c in acme.chat.completions.create(
            model=model, messages=ask_json, max_tokens=48, seed=1, tools=[lookup], stream=True,
            tool_choice={"type": "function", "function": {"name": "lookup_code"}}) if c.choices]
        [delta_call] = [call for c in streamed_call for call in (c.choices[0].delta.tool_calls or [])]
        assert (delta_call.index, delta_call.function.name, delta_call.function.arguments) == \
            (0, "lookup_code", call.function.arguments)
        assert streamed_call[-1].choices[0].finish_reason == "tool_calls"
        # the conversation goes on: the call and its result are rendered for the model
        followed = acme.chat.completions.create(model=model, max_tokens=8, temperature=0, tools=[lookup], messages=[
            *MESSAGES, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": "QT-583"}])
        assert followed.choices[0].finish_reason in ("stop", "length", "tool_calls")
        with pytest.raises(openai.BadRequestError) as bad:
            acme.chat.completions.create(model=model, messages=[*MESSAGES, {"role": "tool", "content": "x"}])
        assert bad.value.param == f"messages.{len(MESSAGES)}.tool_call_id"
        with pytest.raises(openai.BadRequestError) as bad:
            acme.chat.completions.create(model=model, messages=MESSAGES, n=9)
        assert bad.value.param == "n"
        assert plane.platform.inference.stats()["base_loads"] == 1
    finally:
        plane.close()


def test_the_vllm_sampling_extensions_reach_the_engine_and_are_checked(served):
    platform, http, tenants = served
    headers = _auth(tenants.keys["acme"])
    request = {"model": tenants.models["acme"], "messages": MESSAGES, "max_tokens": 9}
    # ignore_eos: the whole budget, whatever the model would end with
    whole = http.post("/v1/chat/completions", headers=headers, json=request | {
        "temperature": 0.8, "seed": 3, "top_k": 20, "repetition_penalty": 1.2, "ignore_eos": True,
        "min_tokens": 9}).json()
    assert whole["usage"]["completion_tokens"] == 9 and whole["choices"][0]["finish_reason"] == "length"
    again = http.post("/v1/chat/completions", headers=headers, json=request | {
        "temperature": 0.8, "seed": 3, "top_k": 20, "repetition_penalty": 1.2, "ignore_eos": True,
        "min_tokens": 9}).json()
    assert again["choices"][0]["message"] == whole["choices"][0]["message"]
    for extra, param in (({"min_tokens": 10}, "min_tokens"), ({"top_k": -2}, "top_k"),
                         ({"repetition_penalty": 0}, "repetition_penalty")):
        refused = http.post("/v1/chat/completions", headers=headers, json=request | extra)
        assert refused.status_code == 400, extra
        assert refused.json()["error"]["param"] == param


def test_a_full_model_queue_answers_429_with_retry_after(served):
    platform, http, tenants = served
    headers = _auth(tenants.keys["acme"])
    request = {"model": BASE, "messages": MESSAGES, "max_tokens": 2}
    assert http.post("/v1/chat/completions", headers=headers, json=request).status_code == 200
    engine = platform.inference
    engine.max_queue = engine.max_queue_per_tenant = 1
    batcher = next(entry.batcher for entry in engine._models.values())
    batcher.max_queue = batcher.max_queue_per_tenant = 1
    release, started = threading.Event(), threading.Event()

    def hold() -> None:
        started.set()
        release.wait(60)

    holder = threading.Thread(target=batcher.call, args=(hold,), daemon=True)
    holder.start()
    assert started.wait(30)
    try:
        first = threading.Thread(target=lambda: http.post("/v1/chat/completions", headers=headers, json=request))
        first.start()
        deadline = time.monotonic() + 30
        while batcher.load()["waiting"] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        busy = http.post("/v1/chat/completions", headers=headers, json=request)
        assert busy.status_code == 429
        assert busy.json()["error"]["code"] == "engine_overloaded"
        assert int(busy.headers["Retry-After"]) >= 1
    finally:
        release.set()
    first.join(30)
    holder.join(30)
    assert http.post("/v1/chat/completions", headers=headers, json=request).status_code == 200  # room again
