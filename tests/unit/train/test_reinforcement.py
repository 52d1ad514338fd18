"""Reinforcement fine-tuning (GRPO) on the tiny model, in-process: the reward a grader gives rises,
every step's figures reach the events, a resumed run is bit-identical, and a grader that fails on
most samples stops the job as the tenant's fault.

The task: prompts about a word, rewarded by how close the completion comes to "the the the the the
the" (a `text_similarity` grader, `fuzzy_match`, the reference read from the item): a dense reward
(a sparse one, 1 for "contains 'the'", depends on the random base ever writing it) that the random
base scores ~0.26 on and a LoRA adapter raises to ~0.48 in 16 steps of 4 prompts x 8 samples."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch
import torch

from tests.helpers.tiny import next_attempt, stage_job
from tuneforge import methods
from tuneforge.domain.exit_codes import TrainerExit
from tuneforge.storage import layout
from tuneforge.train.objectives.reinforcement import ReinforcementObjective, metric_name
from tuneforge.train.reporter import RecordingReporter
from tuneforge.train.runner import run_attempt

WORDS = ["cats", "dogs", "code", "rain", "tea", "maps", "trees", "birds"]
NEAR_THE = {"type": "text_similarity", "name": "near the", "evaluation_metric": "fuzzy_match",
            "input": "{{sample.output_text}}", "reference": "{{item.target}}"}
CONTAINS_THE = {"type": "string_check", "name": "has the", "operation": "like",
                "input": "{{sample.output_text}}", "reference": "the"}
STEPS = 16


def prompt_lines(words: list[str], target: str = "the the the the the the") -> list[dict[str, Any]]:
    return [{"messages": [{"role": "user", "content": f"Say something about {word}"}], "target": target}
            for word in words]


def _stage(root: Path, model_dir: Path, grader: dict[str, Any] = NEAR_THE, steps: int = STEPS,
           **options: Any) -> tuple[Any, Any]:
    method = methods.get("reinforcement")
    asked = {"grader": grader, "samples_per_prompt": 8, "max_completion_tokens": 16, "eval_interval": 4, **options}
    resolved = method.resolve_options(method.parse_hyperparameters(asked)).model_dump()
    spec, store = stage_job(root, model_dir, training=prompt_lines(WORDS), validation=prompt_lines(WORDS[:4]),
                            hyperparameters={"n_epochs": steps * 4 // len(WORDS), "batch_size": 4,
                                             "micro_batch_size": 2, "learning_rate": 5e-3,
                                             "method_options": resolved},
                            checkpoint={"every_steps": 4, "keep_last": 10})
    return replace(spec, method="reinforcement"), store


TIMING = {"tokens_per_second", "mfu", "peak_memory_mb"}  # of the machine, not of the run


def _figures(reporter: RecordingReporter) -> dict[int, dict[str, Any]]:
    return {event["data"]["step"]: {key: value for key, value in event["data"].items() if key not in TIMING}
            for event in reporter.events("metrics")}


def _adapter(store: Any, spec: Any) -> dict[str, torch.Tensor]:
    prefix = layout.artifact_prefix(spec.tenant_id, spec.job_id, "adapter")
    return safetensors.torch.load(store.get_bytes(f"{prefix}/adapter_model.safetensors"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> tuple[RecordingReporter, Any, Any]:
    spec, store = _stage(tmp_path_factory.mktemp("rft-reference"), tiny_model_dir)
    reporter = RecordingReporter()
    assert run_attempt(spec, store, reporter) == TrainerExit.SUCCESS
    return reporter, spec, store


def test_the_reward_rises_and_every_step_reports_its_figures(reference: Any) -> None:
    reporter, _spec, _store = reference
    figures = _figures(reporter)
    assert sorted(figures) == list(range(1, STEPS + 1))
    for step in figures.values():
        assert {"reward_mean", "reward_std", "zero_variance_groups", "grader_error_rate", "completion_length",
                "clip_fraction"} <= set(step)
        assert 0.0 <= step["reward_mean"] <= 1.0 and step["grader_error_rate"] == 0.0
        assert 1 <= step["completion_length"] <= 16
        assert step["clip_fraction"] == 0.0  # one update per batch of rollouts: the ratio is 1
    first = sum(figures[step]["reward_mean"] for step in (1, 2, 3)) / 3
    last = sum(figures[step]["reward_mean"] for step in (STEPS - 2, STEPS - 1, STEPS)) / 3
    assert first < 0.35 and last > first + 0.12, (first, last)
    # validation every eval_interval (4) steps: one sample of each validation prompt, graded
    validated = {step: data["valid_reward_mean"] for step, data in figures.items() if "valid_reward_mean" in data}
    assert {4, 8, 12, 16} <= set(validated)  # (and at each checkpoint)
    assert all(0.0 < value < 1.0 for value in validated.values())
    checkpoints = reporter.of_kind("checkpoints")
    assert checkpoints[-1]["metrics"]["reward_mean"] == figures[STEPS]["reward_mean"]


def test_a_resumed_run_is_bit_identical(tmp_path: Path, tiny_model_dir: Path, reference: Any) -> None:
    ref_reporter, ref_spec, ref_store = reference
    first, store = _stage(tmp_path, tiny_model_dir)
    first = replace(first, extra={"stop_after_step": 6})
    reporter, second = RecordingReporter(), RecordingReporter(attempt=2)
    assert run_attempt(first, store, reporter) == TrainerExit.PREEMPTED
    assert run_attempt(next_attempt(first), store, second) == TrainerExit.SUCCESS
    assert min(_figures(second)) == 7
    assert {**_figures(reporter), **_figures(second)} == _figures(ref_reporter)
    theirs, ours = _adapter(ref_store, ref_spec), _adapter(store, first)
    assert theirs.keys() == ours.keys() and all(torch.equal(theirs[name], ours[name]) for name in theirs)


def test_a_multi_grader_reports_each_sub_grader_and_combines_them(tmp_path: Path, tiny_model_dir: Path) -> None:
    multi = {"type": "multi", "name": "both", "calculate_output": "0.75 * has_the + 0.25 * short",
             "graders": {"has_the": {**CONTAINS_THE, "name": "has_the"},
                         "short": {"type": "string_check", "name": "short", "operation": "ne",
                                   "input": "{{sample.output_text}}", "reference": ""}}}
    spec, store = _stage(tmp_path, tiny_model_dir, grader=multi, steps=2)
    reporter = RecordingReporter()
    assert run_attempt(spec, store, reporter) == TrainerExit.SUCCESS
    for data in _figures(reporter).values():
        combined = 0.75 * data["reward_has_the"] + 0.25 * data["reward_short"]
        assert data["reward_mean"] == pytest.approx(combined)


def test_a_grader_that_fails_on_most_samples_fails_the_job_as_the_tenants(tmp_path: Path,
                                                                          tiny_model_dir: Path) -> None:
    missing = {**NEAR_THE, "reference": "{{sample.output_json.answer}}"}  # the samples are not JSON
    spec, store = _stage(tmp_path, tiny_model_dir, grader=missing, steps=4)
    reporter = RecordingReporter()
    assert run_attempt(spec, store, reporter) == TrainerExit.USER_ERROR
    [failure] = reporter.of_kind("failure") or [None]
    assert failure is not None and failure["code"] == "grader_failed"
    assert failure["param"] == "method.reinforcement.grader"
    assert [data["grader_error_rate"] for data in _figures(reporter).values()] == [1.0]  # step 2 stopped it


def test_kl_to_the_base_is_reported_and_pulls_towards_it(tmp_path: Path, tiny_model_dir: Path) -> None:
    spec, store = _stage(tmp_path, tiny_model_dir, steps=4, kl_coef=0.5)
    reporter = RecordingReporter()
    assert run_attempt(spec, store, reporter) == TrainerExit.SUCCESS
    kls = [data["kl"] for data in _figures(reporter).values()]
    assert kls[0] == pytest.approx(0.0, abs=1e-6)  # step 1: the adapter starts as the identity
    assert all(kl >= 0 for kl in kls) and kls[-1] > 0


def test_metric_names_of_sub_graders() -> None:
    assert metric_name("Has The!") == "reward_has_the"
    assert metric_name("x" * 100) == "reward_" + "x" * 57


def test_the_objective_refuses_data_without_the_fields_its_grader_reads(tmp_path: Path,
                                                                        tiny_model_dir: Path) -> None:
    from tuneforge.data.errors import BadDataError
    from tuneforge.methods.reinforcement import ReinforcementOptions

    spec, store = _stage(tmp_path, tiny_model_dir, steps=1)
    lines = [{"messages": [{"role": "user", "content": "hi"}]}]
    store.put_bytes(spec.training_file.key, "".join(json.dumps(line) + "\n" for line in lines).encode())
    objective = ReinforcementObjective(ReinforcementOptions(grader=NEAR_THE))
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    with pytest.raises(BadDataError) as caught:
        objective.load(store, spec.training_file, tokenizer, spec.hyperparameters, label="training",
                       base_model_sha256="x")
    assert caught.value.code == "missing_field" and caught.value.line_number == 1 and caught.value.param == "target"


def test_the_memory_model_counts_the_rollouts_key_value_cache() -> None:
    from tuneforge.planning.memory import GIB, MERGED_ADAPTER_BYTES, ModelShape, estimate, rollout_bytes

    llama_7b = ModelShape.from_config({"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008,
                                       "num_hidden_layers": 32, "num_attention_heads": 32,
                                       "num_key_value_heads": 32, "vocab_size": 32000})
    # 64 sequences of 1024 tokens: 64 x 1024 x 32 layers x (key + value) x 4096 x 2 bytes = 32 GiB of cache
    cache = 64 * 1024 * 32 * 2 * 4096 * 2
    assert cache == 32 * GIB
    last_logits = 64 * 32000 * (2 + 2 * 4)  # the last position's logits, and fp32 logits and probabilities
    prefill_layer = 64 * 1024 * (2 * 11008 + 2 * 4096) * 2  # one layer's MLP at the widest, and its input/output
    held = rollout_bytes(llama_7b, 64, 1024, weight_bytes=2)
    assert held == cache + last_logits + prefill_layer
    without = estimate(llama_7b, training_type="lora", micro_batch_size=1, seq_len=1024)
    with_rollouts = estimate(llama_7b, training_type="lora", micro_batch_size=1, seq_len=1024,
                             rollout_sequences=64, rollout_tokens=1024)
    resident = with_rollouts.weights + with_rollouts.gradients + with_rollouts.optimizer + with_rollouts.overhead
    # sampling happens between steps, when the activations are gone: it is the peak when it is the largest
    assert with_rollouts.rollout == held and with_rollouts.total_bytes == resident + held > without.total_bytes
    assert rollout_bytes(llama_7b, 0, 1024, weight_bytes=2) == 0
    # a model whose linear weights fit MERGED_ADAPTER_BYTES samples through a merged copy of them: counted
    small = ModelShape.from_config({"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
                                    "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
                                    "vocab_size": 151936})
    copy = small.linear_parameters() * 2
    assert 0 < copy <= MERGED_ADAPTER_BYTES
    lora = estimate(small, training_type="lora", micro_batch_size=1, seq_len=512, rollout_sequences=16,
                    rollout_tokens=512)
    assert lora.rollout == rollout_bytes(small, 16, 512, weight_bytes=2) + copy
    for other in ({"training_type": "full"}, {"training_type": "lora", "shards": 2}):
        assert estimate(small, micro_batch_size=1, seq_len=512, rollout_sequences=16, rollout_tokens=512,
                        **other).rollout == rollout_bytes(small, 16, 512, weight_bytes=2), other


def test_a_response_format_makes_every_sample_one_json_object(tmp_path: Path, tiny_model_dir: Path) -> None:
    from tuneforge.graders.templates import parse_json
    from tuneforge.train import sampling

    reads_json = {"type": "string_check", "name": "has answer", "operation": "ne",
                  "input": "{{sample.output_json}}", "reference": ""}
    schema = {"type": "json_schema", "json_schema": {"name": "answer", "schema": {"type": "object"}}}
    spec, store = _stage(tmp_path, tiny_model_dir, grader=reads_json, steps=2, response_format=schema,
                         max_completion_tokens=24)
    texts: list[str] = []
    original = sampling.sample

    def recording(*args: Any, **kwargs: Any) -> Any:
        completions = original(*args, **kwargs)
        texts.extend(kwargs["json_tokenizer"].decode(ids, skip_special_tokens=True) for ids in completions.token_ids)
        return completions

    reporter = RecordingReporter()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sampling, "sample", recording)
        assert run_attempt(spec, store, reporter) == TrainerExit.SUCCESS
    assert len(texts) >= 2 * 4 * 8
    assert all(isinstance(parse_json(text), dict) for text in texts), [t for t in texts if parse_json(t) is None][:3]
    assert all(data["grader_error_rate"] == 0.0 for data in _figures(reporter).values())
