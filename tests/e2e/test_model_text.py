"""A model's own text never wedges its job: a tiny model whose byte-level tokenizer emits NUL,
other C0 and C1 controls and DEL — greedy decoding after every prompt — is fine-tuned with the
default eval on a real plane (real trainer process, real HTTP reports). The job succeeds, its eval
samples (the models' answers, and a task file whose text holds lone surrogates and controls) are
stored and shown escaped, and chat answers, streamed and not, are valid JSON with the same escapes.

Before this was fixed, the `result` report carrying those samples was refused 400 by the request
guard, the trainer retried it for 120 s, exited `platform_error`, and the job was retried three
times and failed as the platform's fault (refunded)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import httpx
import pytest
import torch

from tests.e2e.conftest import start_plane
from tests.e2e.test_lifecycle import wait_for
from tuneforge.demo.dataset import demo_examples
from tuneforge.demo.tiny_model import build_tiny_model, save_model_folder

pytestmark = [pytest.mark.e2e, pytest.mark.sqlite_pass_only]

# what the model emits in a cycle after the prompt's last token ("\n" of the assistant turn)
EMITTED = ("\x00", "\x07", "\x1b", "\x85", "\x7f")
# any C0 control but \t \n \r, DEL, any C1 control, any surrogate: what must never be shown raw
RAW_UNSAFE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")
ESCAPED = ("\\u0000", "\\u0007", "\\u001b", "\\u007f")
EMBEDDING_SCALE = 40.0  # the cycle token's own embedding drowns what attention mixes in
LOGIT_SCALE = 12.0  # the successor's logit then dwarfs every other token's


def build_byte_emitting_model(out_dir: Path) -> Path:
    """The demo's tiny Llama rewired so greedy decoding walks a cycle of control bytes: each cycle
    token's embedding is one basis direction, and only its successor's output row reads it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    raw = build_tiny_model(out_dir.parent / f"{out_dir.name}-raw", seed=0)
    tokenizer = AutoTokenizer.from_pretrained(raw)
    model = AutoModelForCausalLM.from_pretrained(raw, dtype=torch.float32)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                           add_generation_prompt=True)
    last_prompt_token = tokenizer(prompt, add_special_tokens=False)["input_ids"][-1]
    # byte-level BPE: each control character is its own byte token (U+0085 is two bytes, two tokens)
    cycle = [last_prompt_token] + [t for ch in EMITTED for t in tokenizer.encode(ch, add_special_tokens=False)]
    with torch.no_grad():
        embeddings, head = model.model.embed_tokens.weight, model.lm_head.weight
        head[:, :len(cycle)] = 0
        for position, token in enumerate(cycle):
            successor = cycle[position + 1] if position + 1 < len(cycle) else cycle[1]
            embeddings[token] = 0
            embeddings[token, position] = EMBEDDING_SCALE
            head[successor] = 0
            head[successor, position] = LOGIT_SCALE
    return save_model_folder(model, tokenizer, out_dir)


@pytest.fixture(scope="module")
def byte_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_byte_emitting_model(tmp_path_factory.mktemp("byte-model") / "model")


@pytest.fixture
def plane(tmp_path, database_url, byte_model_dir):
    world = start_plane(tmp_path, database_url, byte_model_dir, eval_by_default=True)
    yield world
    world.close()


def _upload(sdk, rows: list[dict], name: str, purpose: str) -> str:
    # ensure_ascii: lone surrogates travel as JSON escapes, as any JSON encoder writes them
    data = "".join(json.dumps(row) + "\n" for row in rows).encode()
    return sdk.files.create(file=(name, io.BytesIO(data)), purpose=purpose).id


def _assert_safe(text: str) -> None:
    assert RAW_UNSAFE.search(text) is None, repr(text)
    text.encode("utf-8")


def _strings(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for item in value.values() for s in _strings(item)]
    if isinstance(value, list):
        return [s for item in value for s in _strings(item)]
    return []


def test_a_model_emitting_control_bytes_succeeds_and_its_text_is_stored_and_shown_escaped(plane):
    sdk = plane.sdk(plane.key_a)
    training = _upload(sdk, demo_examples(n_keys=12), "train.jsonl", "fine-tune")
    task = [{"messages": [{"role": "user", "content": f"case {i}: odd \ud800 text \x07"},
                          {"role": "assistant", "content": f"ref \udfff {i}"}]} for i in range(3)]
    job = sdk.fine_tuning.jobs.create(
        model="tiny-chat", training_file=training, seed=0, suffix="bytes",
        method={"type": "supervised", "supervised": {"hyperparameters": {
            "n_epochs": 1, "batch_size": 8, "learning_rate_multiplier": 0.1}}},
        extra_body={"eval": {"task_file": _upload(sdk, task, "task.jsonl", "evals"), "max_new_tokens": 12,
                             "max_examples": 8}})
    done = wait_for(sdk, job.id)
    assert done.status == "succeeded", done.error
    attempts = httpx.get(f"{plane.url}/v1/fine_tuning/jobs/{done.id}/attempts",
                         headers={"Authorization": f"Bearer {plane.key_a}"})
    assert attempts.status_code == 200 and len(attempts.json()["data"]) == 1  # one attempt, nothing retried

    results = done.model_extra["eval_results"]
    samples = results["samples"]
    answers = [s[side] for suite in ("safety", "task") for s in samples[suite] for side in ("base", "fine_tuned")]
    assert len(answers) >= 10
    for text in _strings(results):
        _assert_safe(text)
    # the model's bytes are there, visibly escaped; the tenant's lone surrogates became U+FFFD
    assert sum(any(e in answer for e in ESCAPED) for answer in answers) >= len(answers) // 2
    assert any("\\u0085" in answer for answer in answers)
    assert samples["task"][0]["prompt"].endswith("case 0: odd \ufffd text \\u0007")
    assert samples["task"][0]["reference"] == "ref \ufffd 0"
    model = httpx.get(f"{plane.url}/v1/models/{done.fine_tuned_model}",
                      headers={"Authorization": f"Bearer {plane.key_a}"})
    assert model.status_code == 200
    model.content.decode("utf-8")
    for text in _strings(model.json().get("eval_results") or {}):
        _assert_safe(text)
    _check_chat(plane, done.fine_tuned_model)


def _check_chat(plane, model_id: str) -> None:
    """Chat answers of the built-in engine, whole and streamed: valid JSON, escapes, no raw bytes."""
    headers = {"Authorization": f"Bearer {plane.key_a}"}
    body = {"model": model_id, "max_tokens": 10, "temperature": 0,
            "messages": [{"role": "user", "content": "say something"}]}
    whole = httpx.post(f"{plane.url}/v1/chat/completions", json=body, headers=headers, timeout=60)
    assert whole.status_code == 200, whole.text
    content = json.loads(whole.content.decode("utf-8"))["choices"][0]["message"]["content"]
    _assert_safe(content)
    assert any(e in content for e in ESCAPED), repr(content)
    pieces = []
    with httpx.stream("POST", f"{plane.url}/v1/chat/completions", json={**body, "stream": True},
                      headers=headers, timeout=60) as stream:
        assert stream.status_code == 200
        for line in stream.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[len("data: "):])
                pieces.extend(c["delta"].get("content") or "" for c in chunk["choices"])
    streamed = "".join(pieces)
    _assert_safe(streamed)
    assert streamed == content  # greedy: the same answer, escaped the same way piece by piece
