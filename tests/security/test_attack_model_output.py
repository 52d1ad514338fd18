"""Attacks: a model's own output (and a tenant's text) aimed at wedging a job or costing the operator.

Against a real `tuneforge up` (two API workers on SQLite, scheduler, local executor) whose base
model `tiny-chat` is rewired so greedy decoding emits NUL, BEL, ESC, U+0085 and DEL after every
prompt (tests/e2e/test_model_text.py), the attacker (free tier):

- fine-tunes it with an eval whose task file holds lone surrogates (`"\\ud800"`) and controls.
  Before: the trainer's tokenizer could not take the surrogates (platform error), and the models'
  NUL-bearing samples made the control plane refuse the `result` report (400), which the trainer
  retried for 120 s; either way three attempts, each refunded as the platform's fault, then a
  failed job. Now: one attempt, the job succeeds, its samples stored escaped;
- asks chat completions, whole and streamed: every answer valid JSON with the bytes escaped.

The bystander's cheap request stays within `BYSTANDER_BOUND_S` throughout.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.e2e.test_model_text import ESCAPED, RAW_UNSAFE, build_byte_emitting_model
from tests.helpers.attack import MODEL_NAME, LiveServer
from tuneforge.demo.dataset import demo_examples

MIB = 2**20
BYSTANDER_BOUND_S = 3.0  # the bystander's GET /v1/models while the attack runs; generous for a loaded 2-core VM
# the server tree includes the attack's trainer process (torch, the model, the eval) while it runs
RSS_GROWTH_BOUND_BYTES = 1500 * MIB
JOB_BOUND_S = 150.0  # the whole job, one attempt (before: three attempts of 120 s of retries each, ~8 min)
TASK_ROWS = 3


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    model_dir = build_byte_emitting_model(tmp_path_factory.mktemp("byte-model") / "model")
    server = LiveServer.start(tmp_path_factory.mktemp("live"), model_dir)
    yield server
    server.stop()


def _upload(client: httpx.Client, rows: list[dict], name: str, purpose: str) -> str:
    data = "".join(json.dumps(row) + "\n" for row in rows).encode()  # lone surrogates as JSON escapes
    answer = client.post("/v1/files", data={"purpose": purpose}, files={"file": (name, io.BytesIO(data))})
    assert answer.status_code == 200, answer.text
    return answer.json()["id"]


def _contained(live: LiveServer, watch) -> None:  # noqa: ANN001 - a Watch
    assert live.alive(), live.log()[-2000:]
    assert not watch.bystander_failures, watch.bystander_failures[:3]
    assert watch.bystander_max_s < BYSTANDER_BOUND_S, watch.summary()
    assert watch.rss_growth_bytes < RSS_GROWTH_BOUND_BYTES, watch.summary()
    print(f"\n{watch.summary()}")


def _wait_terminal(client: httpx.Client, job_id: str, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = client.get(f"/v1/fine_tuning/jobs/{job_id}").json()
        if job["status"] in ("succeeded", "failed", "cancelled"):
            return job
        time.sleep(0.2)
    raise AssertionError(f"{job_id} still {job['status']} after {timeout_s} s")


def test_a_job_whose_model_emits_nul_and_whose_eval_text_holds_surrogates_succeeds_in_one_attempt(
        live: LiveServer) -> None:
    task = [{"messages": [{"role": "user", "content": f"row {i} \ud800 \x1b[2J"},
                          {"role": "assistant", "content": f"ref \udfff {i}"}]} for i in range(TASK_ROWS)]
    with live.client(live.attacker_key) as client, live.watch() as watch:
        training = _upload(client, demo_examples(n_keys=12), "train.jsonl", "fine-tune")
        evals = _upload(client, task, "task.jsonl", "evals")
        started = time.monotonic()
        created = client.post("/v1/fine_tuning/jobs", json={
            "model": MODEL_NAME, "training_file": training, "seed": 0,
            "method": {"type": "supervised", "supervised": {"hyperparameters": {
                "n_epochs": 1, "batch_size": 8, "learning_rate_multiplier": 0.1}}},
            "eval": {"task_file": evals, "golden": False, "safety": False, "max_new_tokens": 8}})
        assert created.status_code == 200, created.text
        job = _wait_terminal(client, created.json()["id"], JOB_BOUND_S)
        elapsed_s = time.monotonic() - started
        attempts = client.get(f"/v1/fine_tuning/jobs/{job['id']}/attempts").json()["data"]
    _contained(live, watch)
    print(f"job {job['status']} in {elapsed_s:.1f} s, {len(attempts)} attempt(s)")
    assert job["status"] == "succeeded", job.get("error")
    assert len(attempts) == 1 and elapsed_s < JOB_BOUND_S
    samples = job["eval_results"]["samples"]["task"]
    assert len(samples) == TASK_ROWS
    for sample in samples:
        for text in sample.values():
            assert RAW_UNSAFE.search(text) is None, repr(text)
    assert sum(any(e in s["fine_tuned"] for e in ESCAPED) for s in samples) == TASK_ROWS
    assert samples[0]["prompt"].endswith("row 0 \ufffd \\u001b[2J") and samples[0]["reference"] == "ref \ufffd 0"


def test_chat_answers_full_of_control_bytes_are_valid_json_whole_and_streamed(live: LiveServer) -> None:
    body = {"model": MODEL_NAME, "max_tokens": 12, "temperature": 0,
            "messages": [{"role": "user", "content": "say anything"}]}
    answers: list[str] = []
    with live.client(live.attacker_key) as client, live.watch() as watch:
        for _round in range(3):
            whole = client.post("/v1/chat/completions", json=body)
            assert whole.status_code == 200, whole.text
            answers.append(json.loads(whole.content.decode("utf-8"))["choices"][0]["message"]["content"])
            pieces: list[str] = []
            with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as stream:
                assert stream.status_code == 200
                for line in stream.iter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        chunk = json.loads(line[len("data: "):])
                        pieces.extend(c["delta"].get("content") or "" for c in chunk["choices"])
            answers.append("".join(pieces))
    _contained(live, watch)
    for answer in answers:
        assert RAW_UNSAFE.search(answer) is None, repr(answer)
        assert any(e in answer for e in ESCAPED), repr(answer)
    assert len(set(answers)) == 1  # greedy: streamed and whole escape the same bytes the same way
