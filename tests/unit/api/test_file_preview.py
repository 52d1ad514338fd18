"""GET /v1/files/{id}/preview: the first examples through the base model's chat template, each
token marked with whether it carries loss — the trained tokens are exactly the assistant turns
with weight 1 (and the template's end-of-turn), a completion and its EOS."""

from __future__ import annotations

import io
import json

import pytest
from fastapi.testclient import TestClient

from tests.helpers.platform import add_base_model, add_tenant, make_platform
from tuneforge.api.app import create_app


@pytest.fixture
def api(tmp_path, database_url, tiny_model_dir):
    platform = make_platform(tmp_path, database_url)
    add_base_model(platform, "tiny-chat", tiny_model_dir)
    keys = add_tenant(platform, "alpha"), add_tenant(platform, "beta")
    with TestClient(create_app(platform=platform)) as http:
        yield http, keys
    platform.db.dispose()


def _upload(http, key: str, name: str, lines: list) -> str:
    body = b"".join((line if isinstance(line, bytes) else json.dumps(line).encode()) + b"\n" for line in lines)
    answer = http.post("/v1/files", files={"file": (name, io.BytesIO(body))}, data={"purpose": "fine-tune"},
                       headers={"Authorization": f"Bearer {key}"})
    assert answer.status_code == 200, answer.text
    return answer.json()["id"]


def _chat(i: int, weight: int = 1) -> dict:
    return {"messages": [{"role": "user", "content": f"what is the code for item {i}?"},
                         {"role": "assistant", "content": f"code {i}0{i}", "weight": weight},
                         {"role": "user", "content": "and again?"},
                         {"role": "assistant", "content": f"again {i}"}]}


def test_the_trained_tokens_are_the_assistant_turns_with_weight(api):
    http, (key, _other) = api
    lines = [_chat(1, weight=0), b"{not json", _chat(2)] + [_chat(i) for i in range(3, 20)]
    file_id = _upload(http, key, "train.jsonl", lines)
    answer = http.get(f"/v1/files/{file_id}/preview", params={"model": "tiny-chat", "limit": 2},
                      headers={"Authorization": f"Bearer {key}"})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["object"] == "file.preview" and body["model"] == "tiny-chat"
    first, second = body["examples"]
    assert (first["line"], second["line"]) == (1, 3)  # the broken line 2 is not an example
    for example in (first, second):
        assert example["num_tokens"] == len(example["tokens"]) and not example["truncated"]
        assert example["num_trained_tokens"] == sum(t["trained"] for t in example["tokens"])
    trained = "".join(t["text"] for t in first["tokens"] if t["trained"])
    whole = "".join(t["text"] for t in first["tokens"])
    assert "again 1" in trained and "code 101" not in trained  # the weight-0 turn carries no loss
    assert "code 101" in whole and "what is the code" not in trained and "and again?" not in trained
    trained = "".join(t["text"] for t in second["tokens"] if t["trained"])
    assert "code 202" in trained and "again 2" in trained and "item 2" not in trained
    everything = http.get(f"/v1/files/{file_id}/preview", params={"model": "tiny-chat", "limit": 1,
                                                                  "train_on_inputs": "true"},
                          headers={"Authorization": f"Bearer {key}"}).json()["examples"][0]
    assert everything["num_trained_tokens"] == everything["num_tokens"] == first["num_tokens"]
    cut = http.get(f"/v1/files/{file_id}/preview", params={"model": "tiny-chat", "limit": 1, "max_seq_length": 16},
                   headers={"Authorization": f"Bearer {key}"}).json()["examples"][0]
    assert cut["num_tokens"] == 16


def test_a_completion_and_its_eos_are_trained_not_the_prompt(api):
    http, (key, _other) = api
    file_id = _upload(http, key, "pc.jsonl", [{"prompt": f"Q{i}: colour of the sky?", "completion": f" blue {i}"}
                                              for i in range(20)])
    [example] = http.get(f"/v1/files/{file_id}/preview", params={"model": "tiny-chat", "limit": 1},
                         headers={"Authorization": f"Bearer {key}"}).json()["examples"]
    trained = [t["text"] for t in example["tokens"] if t["trained"]]
    assert "".join(trained[:-1]).strip() == "blue 0" and "Q0" not in "".join(trained)
    assert example["num_trained_tokens"] == len(trained) >= 2  # the EOS too


def test_preview_refuses_what_it_cannot_show_naming_the_field(api):
    http, (key, other) = api
    file_id = _upload(http, key, "train.jsonl", [_chat(i) for i in range(20)])
    auth = {"Authorization": f"Bearer {key}"}
    wrong_model = http.get(f"/v1/files/{file_id}/preview", params={"model": "nope"}, headers=auth)
    assert wrong_model.status_code == 400 and wrong_model.json()["error"]["param"] == "model"
    too_many = http.get(f"/v1/files/{file_id}/preview", params={"model": "tiny-chat", "limit": 11}, headers=auth)
    assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "limit"
    # another tenant's file does not exist for it
    stranger = http.get(f"/v1/files/{file_id}/preview", params={"model": "tiny-chat"},
                        headers={"Authorization": f"Bearer {other}"})
    assert stranger.status_code == 404
