"""A benchmark task in lm-eval's format, in the operator's local benchmark folder, runs in the
post-training eval of a tiny job (base vs fine-tuned, in points) and its regression gate decides
whether the model may be promoted:

- a job that learns the task's answers (and names the task and a points gate in its body) is
  promoted;
- a job that learns wrong answers runs the operator's default task with the default gate
  (at most 2 points below the base) and is blocked;
- a task name the folder does not hold (or a path) is refused at creation."""

from __future__ import annotations

import io
import json

import httpx
import openai
import pytest

from tests.e2e.conftest import start_plane
from tests.e2e.test_lifecycle import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.sqlite_pass_only]

THINGS = ["apple", "river", "cloud", "stone", "tiger", "piano", "candle", "mirror"]
COLOURS = ["red", "blue", "green", "gold"]
QUESTIONS = [{"question": f"What colour is the {thing}?", "choices": COLOURS, "label": (3 * i + 1) % 4}
             for i, thing in enumerate(THINGS)]
TASK = """\
task: colours
dataset_path: json
dataset_kwargs:
  data_files:
    test: data/colours.jsonl
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{question}}\\nAnswer:"
doc_to_target: label
doc_to_choice: "{{choices}}"
metric_list:
  - metric: acc
  - metric: acc_norm
"""
HP = {"n_epochs": 8, "batch_size": 8, "learning_rate": 5e-3, "warmup_ratio": 0.0}
LORA = {"type": "lora", "rank": 8, "alpha": 16, "dropout": 0.0, "target_modules": "all-linear"}


@pytest.fixture
def plane(tmp_path, database_url, tiny_model_dir):
    folder = tmp_path / "benchmarks" / "colours"
    (folder / "data").mkdir(parents=True)
    (folder / "colours.yaml").write_text(TASK)
    (folder / "data" / "colours.jsonl").write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    world = start_plane(tmp_path, database_url, tiny_model_dir, eval_by_default=True,
                        benchmark_dir=tmp_path / "benchmarks", benchmark_tasks=["colours"])
    yield world
    world.close()


def _rows(shift: int) -> list[dict]:
    return [{"prompt": f"Question: {q['question']}\nAnswer:", "completion": " " + COLOURS[(q["label"] + shift) % 4]}
            for q in QUESTIONS] * 4


def _train(plane, rows: list[dict], eval_body: dict, suffix: str):
    sdk = plane.sdk(plane.key_a)
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    training = sdk.files.create(file=(f"{suffix}.jsonl", io.BytesIO(data)), purpose="fine-tune").id
    job = sdk.fine_tuning.jobs.create(model="tiny-chat", training_file=training, seed=0, suffix=suffix,
                                      method={"type": "supervised", "supervised": {"hyperparameters": HP}},
                                      extra_body={"training_type": LORA, "eval": eval_body})
    done = wait_for(sdk, job.id)
    assert done.status == "succeeded", done.error
    model = httpx.get(f"{plane.url}/v1/models/{done.fine_tuned_model}",
                      headers={"Authorization": f"Bearer {plane.key_a}"}).json()
    return done, model


def _promote(plane, model_id: str) -> httpx.Response:
    return httpx.post(f"{plane.url}/v1/models/{model_id}/promote", json={"stage": "staging"},
                      headers={"Authorization": f"Bearer {plane.key_a}"})


def test_a_benchmark_task_runs_in_the_eval_and_its_points_gate_decides_promotion(plane):
    _refused_at_creation(plane)
    quiet = {"golden": False, "safety": False, "max_new_tokens": 4}
    good, good_model = _train(plane, _rows(0), {**quiet, "benchmarks": ["colours"], "gates": [
        {"metric": "benchmark:colours", "max_regression_points": 2}]}, "right")
    results = good.model_extra["eval_results"]
    assert results["base"]["benchmark:colours"] == 25.0  # the random base picks "red" every time
    assert results["fine_tuned"]["benchmark:colours"] == 100.0
    assert results["fine_tuned"]["benchmark:colours.acc_norm"] == 100.0
    assert results["examples"]["benchmark"] == len(QUESTIONS)
    assert results["gates"]["passed"] is True and good_model["promotable"] is True
    assert good_model["eval_results"]["fine_tuned"]["benchmark:colours"] == 100.0
    shown = good.model_extra["eval"]
    assert shown["benchmarks"] == ["colours"] and "benchmark_dir" not in shown
    assert _promote(plane, good.fine_tuned_model).json()["stage"] == "staging"

    # no benchmarks and no gates in the body: the operator's default task and its default gate
    bad, bad_model = _train(plane, _rows(1), quiet, "wrong")
    results = bad.model_extra["eval_results"]
    assert results["base"]["benchmark:colours"] == 25.0 and results["fine_tuned"]["benchmark:colours"] == 0.0
    [gate] = [g for g in results["gates"]["gates"] if g["metric"] == "benchmark:colours"]
    assert gate["passed"] is False and gate["threshold"] == -2.0 and gate["value"] == -25.0
    assert "fell by 25.00 points" in gate["reason"]
    assert bad_model["promotable"] is False
    refused = _promote(plane, bad.fine_tuned_model)
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "gates_failed"


def _refused_at_creation(plane) -> None:
    sdk = plane.sdk(plane.key_a)
    data = "".join(json.dumps(r) + "\n" for r in _rows(0)).encode()
    training = sdk.files.create(file=("t.jsonl", io.BytesIO(data)), purpose="fine-tune").id
    for name, code in (("mmlu", "unknown_benchmark"), ("../colours", None)):
        with pytest.raises(openai.BadRequestError) as caught:
            sdk.fine_tuning.jobs.create(model="tiny-chat", training_file=training,
                                        extra_body={"eval": {"benchmarks": [name]}})
        error = caught.value.body
        assert error["param"] in ("eval.benchmarks[0]", "eval.benchmarks.0"), error
        if code:
            assert error["code"] == code and "offered: colours" in error["message"]
