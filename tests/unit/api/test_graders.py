"""/v1/fine_tuning/alpha/graders/run and /validate through the official `openai` SDK, and reinforcement
jobs' create checks (the grader, the data's fields, the options) and their shape on retrieve."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import openai
import pytest

from tests.helpers.fake_judge import FakeJudge
from tuneforge.graders import sandbox

NEEDS_SANDBOX = pytest.mark.skipif(sandbox.available() is not None, reason="this host cannot run the sandbox")
EXACT = {"type": "string_check", "name": "exact", "operation": "eq", "input": "{{sample.output_text}}",
         "reference": "{{item.answer}}"}


def test_run_answers_openais_shape_through_the_sdk(world) -> None:
    sdk = world.sdk(world.key_a)
    result = sdk.fine_tuning.alpha.graders.run(grader=EXACT, model_sample="Paris", item={"answer": "Paris"})
    assert result.reward == 1.0 and result.sub_rewards == {}
    assert result.metadata.name == "exact" and result.metadata.type == "string_check"
    assert result.metadata.errors.invalid_variable_error is False and result.metadata.execution_time >= 0
    assert result.metadata.token_usage is None and result.api_model_grader_token_usage_per_model == {}
    assert sdk.fine_tuning.alpha.graders.run(grader=EXACT, model_sample="Lyon", item={"answer": "Paris"}).reward == 0


def test_run_a_multi_grader_reports_sub_rewards(world) -> None:
    multi = {"type": "multi", "name": "m", "calculate_output": "0.5 * exact + 0.5 * sim",
             "graders": {"exact": EXACT, "sim": {"type": "text_similarity", "name": "sim",
                                                 "evaluation_metric": "rouge_l", "input": "{{sample.output_text}}",
                                                 "reference": "{{item.answer}}"}}}
    result = world.sdk(world.key_a).fine_tuning.alpha.graders.run(
        grader=multi, model_sample="the cat sat", item={"answer": "the cat"})
    # rouge_l: LCS 2, P = 2/3, R = 1 -> F1 = 0.8; exact 0 -> 0.4
    assert result.sub_rewards == {"exact": 0.0, "sim": pytest.approx(0.8)}
    assert result.reward == pytest.approx(0.4)


def test_validate_answers_the_grader_and_refuses_bad_ones_naming_the_field(world) -> None:
    graders = world.sdk(world.key_a).fine_tuning.alpha.graders
    assert graders.validate(grader=EXACT).grader.name == "exact"
    cases = [({**EXACT, "operation": "regex"}, "grader.operation"),
             ({**EXACT, "type": "contains"}, "grader.type"),
             ({**EXACT, "reference": "{{answer}}"}, "grader.reference"),
             ({"type": "multi", "name": "m", "calculate_output": "exact + other", "graders": {"exact": EXACT}},
              "grader.calculate_output")]
    for grader, param in cases:
        with pytest.raises(openai.BadRequestError) as caught:
            graders.validate(grader=grader)
        assert caught.value.body["param"] == param, caught.value.body


def test_run_refuses_an_item_without_a_field_the_grader_reads(world) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        world.sdk(world.key_a).fine_tuning.alpha.graders.run(grader=EXACT, model_sample="x", item={"other": 1})
    assert caught.value.body["param"] == "item.answer"


def test_the_routes_need_an_api_key(world) -> None:
    for path in ("/v1/fine_tuning/alpha/graders/run", "/v1/fine_tuning/alpha/graders/validate"):
        answer = world.http.post(path, json={"grader": EXACT, "model_sample": "x"})
        assert answer.status_code == 401


@NEEDS_SANDBOX
def test_a_python_grader_runs_in_the_sandbox_and_a_bad_one_is_refused(world) -> None:
    graders = world.sdk(world.key_a).fine_tuning.alpha.graders
    source = "def grade(sample, item):\n    return len(sample['output_text']) / len(item['reference'])\n"
    grader = {"type": "python", "name": "ratio", "source": source}
    result = graders.run(grader=grader, model_sample="abc", item={"reference": "abcdef"})
    assert result.reward == 0.5 and result.metadata.errors.python_grader_runtime_error is False
    failing = graders.run(grader=grader, model_sample="abc", item={"reference": ""})
    assert failing.reward == 0.0 and failing.metadata.errors.python_grader_runtime_error
    assert "ZeroDivisionError" in failing.metadata.errors.python_grader_runtime_error_details
    with pytest.raises(openai.BadRequestError) as caught:
        graders.validate(grader={**grader, "source": "def grade(sample, item)\n    return 1\n"})
    assert caught.value.body["param"] == "grader.source" and "line 1" in caught.value.body["message"]


def test_python_graders_are_refused_where_the_host_cannot_sandbox(world, monkeypatch) -> None:
    from tuneforge.services.training import graders as grader_service

    monkeypatch.setattr(grader_service.sandbox, "available", lambda python="": "bubblewrap is not installed")
    with pytest.raises(openai.BadRequestError) as caught:
        world.sdk(world.key_a).fine_tuning.alpha.graders.validate(
            grader={"type": "python", "name": "p", "source": "def grade(s, i):\n    return 1\n"})
    assert caught.value.body["param"] == "grader.source" and caught.value.body["code"] == "sandbox_unavailable"


# -- reinforcement jobs --------------------------------------------------------------------------


def prompt_file(sdk: Any, lines: list[dict[str, Any]]) -> str:
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    uploaded = sdk.files.create(file=("prompts.jsonl", io.BytesIO(data)), purpose="fine-tune")
    assert uploaded.status == "processed", uploaded.status_details
    return uploaded.id


def prompts(count: int, **fields: Any) -> list[dict[str, Any]]:
    return [{"messages": [{"role": "user", "content": f"What is {n} + {n}?"}], **fields} for n in range(count)]


def test_a_reinforcement_job_is_created_and_shows_its_grader_as_openai_does(world) -> None:
    sdk = world.sdk(world.key_a)
    training = prompt_file(sdk, prompts(12, answer="4"))
    job = sdk.fine_tuning.jobs.create(
        model=world.base_model, training_file=training,
        method={"type": "reinforcement", "reinforcement": {
            "grader": EXACT, "hyperparameters": {"n_epochs": 1, "compute_multiplier": 2, "reasoning_effort": "low",
                                                 "eval_interval": 3}}})
    again = sdk.fine_tuning.jobs.retrieve(job.id)
    assert again.method.type == "reinforcement"
    assert again.method.reinforcement.grader.name == "exact"
    assert again.method.reinforcement.hyperparameters.compute_multiplier == 2
    assert again.method.reinforcement.hyperparameters.reasoning_effort == "low"


@pytest.mark.parametrize(("block", "param"), [
    ({"hyperparameters": {}}, "method.reinforcement.grader"),
    ({"grader": {**EXACT, "operation": "startswith"}}, "method.reinforcement.grader.operation"),
    ({"grader": EXACT, "hyperparameters": {"samples_per_prompt": 1}},
     "method.reinforcement.hyperparameters.samples_per_prompt"),
    ({"grader": EXACT, "hyperparameters": {"grader": EXACT}}, None),
    ({"grader": EXACT, "response_format": {"type": "text"}}, "method.reinforcement.response_format"),
])
def test_reinforcement_jobs_with_a_bad_block_are_refused(world, block: dict[str, Any], param: str | None) -> None:
    sdk = world.sdk(world.key_a)
    training = prompt_file(sdk, prompts(12, answer="4"))
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.fine_tuning.jobs.create(model=world.base_model, training_file=training,
                                    method={"type": "reinforcement", "reinforcement": block})
    if param is not None:
        assert caught.value.body["param"] == param, caught.value.body


def test_a_grader_in_another_methods_block_and_kl_on_a_full_fine_tune_are_refused(world) -> None:
    sdk = world.sdk(world.key_a)
    training = prompt_file(sdk, prompts(12, answer="4"))
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.fine_tuning.jobs.create(model=world.base_model, training_file=training,
                                    method={"type": "dpo", "dpo": {"grader": EXACT}})
    assert caught.value.body["param"] == "method.dpo.grader"
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.fine_tuning.jobs.create(
            model=world.base_model, training_file=training, extra_body={"training_type": {"type": "full"}},
            method={"type": "reinforcement", "reinforcement": {"grader": EXACT,
                                                               "hyperparameters": {"kl_coef": 0.1}}})
    assert caught.value.body["param"] == "method.reinforcement.hyperparameters.kl_coef"


def test_prompt_data_is_refused_for_supervised_jobs_and_chat_data_for_reinforcement(world) -> None:
    from tests.helpers.platform import chat_lines

    sdk = world.sdk(world.key_a)
    training = prompt_file(sdk, prompts(12, answer="4"))
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.fine_tuning.jobs.create(model=world.base_model, training_file=training)
    assert caught.value.body["code"] == "shape_mismatch"
    chat = sdk.files.create(file=("chat.jsonl", io.BytesIO(chat_lines(12))), purpose="fine-tune").id
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.fine_tuning.jobs.create(model=world.base_model, training_file=chat,
                                    method={"type": "reinforcement", "reinforcement": {"grader": EXACT}})
    assert caught.value.body["code"] == "shape_mismatch"


@contextmanager
def own_api(tmp_path: Any, database_url: str, base_model: Any = None, **settings: Any) -> Iterator[openai.OpenAI]:
    """An API on a platform of its own (the operator's `settings`), and a tenant's SDK client; with
    `base_model`, that folder registered as tiny-chat (a real tokenizer: small jobs validate within create)."""
    from fastapi.testclient import TestClient

    from tests.helpers.platform import add_base_model, add_tenant, make_platform
    from tuneforge.api.app import create_app

    platform = make_platform(tmp_path, database_url, **settings)
    if base_model is not None:
        add_base_model(platform, "tiny-chat", base_model)
    http = TestClient(create_app(platform=platform), raise_server_exceptions=False)
    try:
        yield openai.OpenAI(base_url="http://testserver/v1", api_key=add_tenant(platform, "alpha"), http_client=http,
                            max_retries=0)
    finally:
        http.close()
        platform.db.dispose()


def test_model_graders_ask_the_operators_endpoint_by_name(tmp_path, database_url) -> None:
    judge = FakeJudge([{"role": "assistant", "content": '{"result": 0.7}'},
                       {"role": "assistant", "content": "polite"},
                       {"role": "assistant", "content": None, "refusal": "I can't grade that."}])
    endpoints = {"house-judge": {"url": judge.url, "model": "judge-8b", "api_key": "operator-key"}}
    try:
        with own_api(tmp_path, database_url, eval_endpoints=endpoints) as sdk:
            score = {"type": "score_model", "name": "judge", "model": "house-judge", "range": [0, 1],
                     "sampling_params": {"temperature": 0.2, "seed": 7, "max_completions_tokens": 50},
                     "input": [{"role": "user", "content": "Grade {{sample.output_text}} for {{item.q}}"}]}
            result = sdk.fine_tuning.alpha.graders.run(grader=score, model_sample="4", item={"q": "2+2"})
            assert result.reward == 0.7 and result.metadata.token_usage == 37
            assert result.api_model_grader_token_usage_per_model == {"house-judge": 37}
            asked = judge.requests[0]
            assert asked["path"] == "/v1/chat/completions" and asked["auth"] == "Bearer operator-key"
            assert asked["body"]["model"] == "judge-8b"  # the endpoint's model: the tenant never sees it
            assert asked["body"]["messages"] == [{"role": "user", "content": "Grade 4 for 2+2"}]
            assert (asked["body"]["temperature"], asked["body"]["seed"], asked["body"]["max_completion_tokens"]) \
                == (0.2, 7, 50)
            label = {"type": "label_model", "name": "tone", "model": "house-judge", "labels": ["polite", "rude"],
                     "passing_labels": ["polite"], "input": [{"role": "user", "content": "{{sample.output_text}}"}]}
            assert sdk.fine_tuning.alpha.graders.run(grader=label, model_sample="hi").reward == 1.0
            refused = sdk.fine_tuning.alpha.graders.run(grader=label, model_sample="hi")
            assert refused.reward == 0.0 and refused.metadata.errors.model_grader_refusal_error
            with pytest.raises(openai.BadRequestError) as caught:
                sdk.fine_tuning.alpha.graders.validate(grader={**score, "model": "gpt-4o"})
            assert caught.value.body["param"] == "grader.model" and "house-judge" in caught.value.body["message"]
    finally:
        judge.close()


def test_a_line_without_a_field_the_grader_reads_fails_the_job_at_creation_naming_both(
        tmp_path, database_url, tiny_model_dir) -> None:
    with own_api(tmp_path, database_url, base_model=tiny_model_dir) as sdk:
        lines = prompts(12, answer="4")
        del lines[2]["answer"]
        training = prompt_file(sdk, lines)  # any prompt file uploads: no grader is known yet
        job = sdk.fine_tuning.jobs.create(model="tiny-chat", training_file=training,
                                          method={"type": "reinforcement", "reinforcement": {"grader": EXACT}})
        assert job.status == "failed" and job.error.code == "missing_field"
        assert "line 3" in job.error.message and "'answer'" in job.error.message, job.error.message
        assert job.error.param == "training_file"


def test_cosine_similarity_asks_the_operators_embeddings_endpoint(tmp_path, database_url) -> None:
    embedder = FakeJudge([])
    endpoints = {"house-embed": {"url": embedder.url, "model": "embed-1", "api_key": "operator-key"}}
    try:
        with own_api(tmp_path, database_url, grader_embeddings="house-embed", eval_endpoints=endpoints) as sdk:
            cosine = {"type": "text_similarity", "name": "cos", "evaluation_metric": "cosine",
                      "input": "{{sample.output_text}}", "reference": "{{item.reference}}"}
            # vectors (a, b, c counts): "aab" -> (2, 1, 0), "ab" -> (1, 1, 0): cos = 3 / (sqrt(5) * sqrt(2))
            result = sdk.fine_tuning.alpha.graders.run(grader=cosine, model_sample="aab", item={"reference": "ab"})
            assert result.reward == pytest.approx(3 / (5 ** 0.5 * 2 ** 0.5))
            asked = embedder.requests[0]
            assert asked["path"] == "/v1/embeddings" and asked["body"] == {"model": "embed-1", "input": ["aab", "ab"]}
            assert asked["auth"] == "Bearer operator-key"
    finally:
        embedder.close()


def test_a_model_grader_judged_by_a_model_this_platform_serves_meters_its_tokens(
        tmp_path, database_url, tiny_model_dir) -> None:
    prices = {"judge.served": 1000.0}
    with own_api(tmp_path, database_url, base_model=tiny_model_dir, price_per_million_tokens=prices) as sdk:
        house = {"type": "score_model", "name": "house", "model": "tiny-chat", "range": [0, 10],
                 "sampling_params": {"max_completions_tokens": 12, "seed": 3},
                 "input": [{"role": "user", "content": "Rate {{sample.output_text}} from 0 to 10"}]}
        result = sdk.fine_tuning.alpha.graders.run(grader=house, model_sample="Paris")
        spent = result.api_model_grader_token_usage_per_model["tiny-chat"]
        assert spent == result.metadata.token_usage and spent > 0
        # the random tiny model answers a JSON object, but not {"result": a number in range}: a parse error
        assert (result.reward, result.metadata.errors.model_grader_parse_error) == (0.0, True)
        assert result.metadata.errors.model_grader_server_error is False
        (row,) = sdk.get("/usage", cast_to=object)["tokens"]
        assert row["kind"] == "judge.served" and row["model"] == "tiny-chat" and row["job_id"] is None
        assert row["requests"] == 1 and row["total_tokens"] == spent and 0 < row["completion_tokens"] <= 12
        assert row["cost"] == pytest.approx(spent / 1000, abs=1e-6)
        for model in ("gpt-4o", "route:best", "ft:tiny-chat:other::x1y2z3"):
            with pytest.raises(openai.BadRequestError) as caught:
                sdk.fine_tuning.alpha.graders.validate(grader={**house, "model": model})
            assert caught.value.body["param"] == "grader.model", model
            assert "a base model (tiny-chat)" in caught.value.body["message"]


def test_a_model_grader_asks_the_tenants_own_endpoint_with_its_secret_through_the_egress_policy(
        tmp_path, database_url) -> None:
    judge = FakeJudge([{"role": "assistant", "content": '{"result": 0.7}'}])
    mine = {"type": "score_model", "name": "mine", "model": "my-judge-7b", "endpoint": judge.url,
            "api_key_secret": "judge-key", "input": [{"role": "user", "content": "Grade {{sample.output_text}}"}]}
    try:
        with own_api(tmp_path, database_url, egress_allow="127.0.0.1") as sdk:
            refusals = [(mine, "grader.api_key_secret"),  # not stored yet
                        ({**mine, "endpoint": "http://169.254.169.254/v1"}, "grader.endpoint"),
                        ({**mine, "endpoint": "http://10.9.8.7/v1"}, "grader.endpoint"),
                        ({**mine, "endpoint": "file:///etc/passwd"}, "grader.endpoint"),
                        ({key: value for key, value in mine.items() if key != "endpoint"}, "grader")]
            for grader, param in refusals:
                with pytest.raises(openai.BadRequestError) as caught:
                    sdk.fine_tuning.alpha.graders.validate(grader=grader)
                assert caught.value.body["param"] == param, (grader, caught.value.body)
            assert judge.requests == []
            sdk.post("/secrets", body={"name": "judge-key", "value": "tenant-key-123"}, cast_to=object)
            result = sdk.fine_tuning.alpha.graders.run(grader=mine, model_sample="4")
            assert result.reward == 0.7 and result.api_model_grader_token_usage_per_model == {"my-judge-7b": 37}
            (asked,) = judge.requests
            assert asked["auth"] == "Bearer tenant-key-123" and asked["body"]["model"] == "my-judge-7b"
            assert asked["body"]["messages"] == [{"role": "user", "content": "Grade 4"}]
            (row,) = sdk.get("/usage", cast_to=object)["tokens"]
            assert (row["kind"], row["model"], row["requests"], row["prompt_tokens"], row["completion_tokens"]) \
                == ("judge.tenant", "my-judge-7b", 1, 30, 7)
    finally:
        judge.close()
