"""Benchmark scoring on the tiny model: batched log-likelihoods equal a plain one-sequence-at-a-time
computation, and batched left-padded greedy decoding equals decoding each prompt alone."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tuneforge.eval import benchmarks
from tuneforge.train import benchmark_runner

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    return model, tokenizer


def _task(output_type: str = "multiple_choice") -> benchmarks.BenchmarkTask:
    requests = (
        benchmarks.Request("Question: what colour is the sky?\nAnswer:", (" blue", " green", " a deep red"), 0),
        benchmarks.Request("Question: 2 + 2 =\nAnswer:", (" 4", " five", " 22"), 0),
        # one token each for the tiny tokenizer: one shared sequence
        benchmarks.Request("Pick one:", (" the", " no", " is", " a"), 2),
        benchmarks.Request("A much longer context that goes on for a while before it asks which one is right:",
                           (" yes", " no"), 1),
    )
    return benchmarks.BenchmarkTask("t", output_type, ("acc", "acc_norm"), requests)  # type: ignore[arg-type]


@torch.no_grad()
def _by_hand(model, tokenizer, context: str, continuation: str) -> float:
    """Sum of log p(continuation token | everything before it), one unpadded sequence."""
    stripped = context.rstrip(" ")
    continuation = context[len(stripped):] + continuation
    context_ids = tokenizer(stripped)["input_ids"]
    continuation_ids = tokenizer(continuation, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([context_ids + continuation_ids])
    logprobs = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
    return sum(float(logprobs[len(context_ids) + i - 1, token]) for i, token in enumerate(continuation_ids))


def test_batched_log_likelihoods_equal_scoring_each_choice_alone(tiny):
    model, tokenizer = tiny
    task = _task()
    expected = [[_by_hand(model, tokenizer, r.context, c) for c in r.choices] for r in task.requests]
    for batch_size in (1, 3, 16):
        got = benchmark_runner.loglikelihoods(model, tokenizer, CPU, task, batch_size=batch_size)
        assert sum(got, []) == pytest.approx(sum(expected, []), abs=1e-4)
    assert benchmarks.choice_scores(task, got) == benchmarks.choice_scores(task, expected)


def test_single_token_choices_share_one_sequence(tiny):
    _model, tokenizer = tiny
    pairs = benchmark_runner._pairs(_task(), tokenizer, 2048)
    shared = [p for p in pairs if p.request == 2]
    assert len(shared) == 1 and shared[0].choices == (0, 1, 2, 3)
    assert len(pairs) == 3 + 3 + 1 + 2


def test_run_task_gives_points_under_the_tasks_keys(tiny):
    model, tokenizer = tiny
    out = benchmark_runner.run_task(model, tokenizer, CPU, _task(), batch_size=4)
    assert set(out) == {"benchmark:t", "benchmark:t.acc", "benchmark:t.acc_norm"}
    assert out["benchmark:t"] == out["benchmark:t.acc"] and out["benchmark:t.acc"] in (0.0, 25.0, 50.0, 75.0, 100.0)


def test_batched_greedy_generation_equals_one_prompt_at_a_time(tiny):
    model, tokenizer = tiny
    requests = tuple(benchmarks.Request(text, target="x") for text in
                     ("Q: hello\nA:", "Q: a longer question about the weather today\nA:", "Hi"))
    task = benchmarks.BenchmarkTask("g", "generate_until", ("exact_match",), requests, until=(), max_gen_toks=6)
    alone = benchmark_runner.generations(model, tokenizer, CPU, task, batch_size=1)
    together = benchmark_runner.generations(model, tokenizer, CPU, task, batch_size=3)
    assert together == alone and all(isinstance(text, str) for text in alone)


def test_a_task_the_trainer_cannot_read_is_recorded_and_the_others_run(tmp_path):
    from types import SimpleNamespace

    from tuneforge.domain.resolved import ResolvedEval
    from tuneforge.train import evaluate

    (tmp_path / "ok.yaml").write_text(
        "task: ok\ndataset_path: ok.jsonl\ntest_split: train\noutput_type: multiple_choice\n"
        "doc_to_text: q\ndoc_to_target: a\ndoc_to_choice: c\n")
    (tmp_path / "ok.jsonl").write_text('{"q": "Sky?", "c": ["blue", "red"], "a": 0}\n')
    (tmp_path / "bad.yaml").write_text("task: bad\nprocess_docs: !function utils.go\n")
    reports = []
    run = SimpleNamespace(reporter=SimpleNamespace(report=lambda kind, body: reports.append((kind, body))))
    errors: list[dict] = []
    config = ResolvedEval(benchmarks=("ok", "bad", "missing"), benchmark_dir=str(tmp_path))
    loaded = evaluate._benchmarks(run, config, errors)
    assert [task.name for task in loaded] == ["ok"]
    assert [(e["task"], e["suite"]) for e in errors] == [("bad", "benchmark"), ("missing", "benchmark")]
    assert "!function" in errors[0]["message"] and "offered: bad, ok" in errors[1]["message"]
    assert len(reports) == 2
