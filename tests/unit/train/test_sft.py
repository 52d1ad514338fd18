"""The SFT recipe in-process: learning, exact resume, failures and stops."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import replace
from pathlib import Path

import pytest
import safetensors.torch
import torch

from tests.helpers.tiny import (
    BASE_MODEL_NAME,
    BASE_MODEL_SHA,
    TENANT_ID,
    jsonl_bytes,
    next_attempt,
    stage_job,
)
from tuneforge.data.tokenize import tokenize_example
from tuneforge.demo.dataset import demo_examples
from tuneforge.domain.exit_codes import TrainerExit
from tuneforge.storage import layout
from tuneforge.train import checkpoint as ckpt
from tuneforge.train.reporter import RecordingReporter
from tuneforge.train.runner import run_attempt

METRIC_KEYS = {
    "step", "total_steps", "train_loss", "train_mean_token_accuracy",
    "learning_rate", "grad_norm", "tokens_per_second",
}


def _adapter(store, spec) -> dict[str, torch.Tensor]:
    prefix = layout.artifact_prefix(spec.tenant_id, spec.job_id, "adapter")
    return safetensors.torch.load(store.get_bytes(f"{prefix}/adapter_model.safetensors"))


def _results(store, spec) -> list[dict[str, str]]:
    text = store.get_bytes(layout.results_key(spec.tenant_id, spec.job_id)).decode()
    return list(csv.DictReader(io.StringIO(text)))


def test_short_run_learns_and_writes_every_artifact(tmp_path: Path, tiny_model_dir: Path) -> None:
    examples = demo_examples(n_keys=12)
    spec, store = stage_job(
        tmp_path, tiny_model_dir, training=examples, validation=examples[:4],
        hyperparameters={"n_epochs": 3, "batch_size": 4, "micro_batch_size": 2},
        checkpoint={"every_steps": 3, "keep_last": 2},
    )
    reporter = RecordingReporter()
    assert run_attempt(spec, store, reporter) == TrainerExit.SUCCESS

    metrics = [event["data"] for event in reporter.events("metrics")]
    assert [m["step"] for m in metrics] == list(range(1, 10))
    assert all(METRIC_KEYS <= set(m) and m["total_steps"] == 9 for m in metrics)
    assert [m["step"] for m in metrics if "valid_loss" in m] == [3, 6, 9]
    assert all(m["tokens_per_second"] > 0 for m in metrics)
    losses = [m["train_loss"] for m in metrics]
    assert sum(losses[-3:]) / 3 < 0.6 * losses[0], losses

    # Every LoRA matrix moved away from its initialisation (B starts at zero).
    adapter = _adapter(store, spec)
    lora_b = [tensor for name, tensor in adapter.items() if "lora_B" in name]
    assert len(lora_b) == 2 * 7 and all(float(t.abs().sum()) > 0 for t in lora_b)

    result = reporter.of_kind("result")[0]
    tokens_per_epoch = sum(
        len(tokenize_example(e, _tokenizer(tiny_model_dir), max_seq_length=128).input_ids) for e in examples
    )
    assert result["trained_tokens"] == 3 * tokens_per_epoch
    assert result["metrics"]["valid_loss"] == metrics[-1]["valid_loss"]
    assert result["adapter_prefix"] == layout.artifact_prefix(TENANT_ID, spec.job_id, "adapter")

    rows = _results(store, spec)
    assert list(rows[0]) == ["step", "train_loss", "train_accuracy", "valid_loss", "valid_mean_token_accuracy"]
    assert [row["step"] for row in rows] == [str(step) for step in range(1, 10)]
    assert [row["step"] for row in rows if row["valid_loss"]] == ["3", "6", "9"]

    assert [c["step"] for c in reporter.of_kind("checkpoints")] == [3, 6, 9]
    root = layout.checkpoints_prefix(TENANT_ID, spec.job_id)
    assert [step for step, _ in ckpt.checkpoint_dirs(store, root)] == [9, 6]  # keep_last=2
    assert reporter.heartbeats[-1] == (9, 9)
    seqs = [body["seq"] for _, body in reporter.reports]
    assert seqs == sorted(set(seqs))


def test_a_checkpoint_ends_every_epoch_and_retention_counts_epochs(tmp_path: Path, tiny_model_dir: Path) -> None:
    """3 epochs of 3 steps, a checkpoint every 4 steps too, keep_last 2: checkpoints at 4, 6, 8 and 9,
    the ends of the last 2 epochs marked (the first epoch's end would be pruned: it is not written);
    kept at the end: those 2 (OpenAI keeps its last 3)."""
    examples = demo_examples(n_keys=12)
    spec, store = stage_job(
        tmp_path, tiny_model_dir, training=examples, validation=examples[:4],
        hyperparameters={"n_epochs": 3, "batch_size": 4, "micro_batch_size": 2},
        checkpoint={"every_steps": 4, "keep_last": 2},
    )
    reporter = RecordingReporter()
    assert run_attempt(spec, store, reporter) == TrainerExit.SUCCESS
    written = reporter.of_kind("checkpoints")
    assert [(c["step"], c["epoch"]) for c in written] == [(4, None), (6, 2), (8, None), (9, 3)]
    for checkpoint in written:
        metrics = checkpoint["metrics"]
        assert metrics["full_valid_loss"] == metrics["valid_loss"] and metrics["valid_loss"] > 0
        assert 0 <= metrics["full_valid_mean_token_accuracy"] <= 1
    root = layout.checkpoints_prefix(TENANT_ID, spec.job_id)
    assert [step for step, _ in ckpt.checkpoint_dirs(store, root)] == [9, 6]


def _tokenizer(model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def test_saved_adapter_loads_with_peft(tmp_path: Path, tiny_model_dir: Path) -> None:
    from peft import AutoPeftModelForCausalLM, PeftModel
    from transformers import AutoModelForCausalLM

    spec, store = stage_job(tmp_path, tiny_model_dir, hyperparameters={"n_epochs": 1})
    assert run_attempt(spec, store, RecordingReporter()) == TrainerExit.SUCCESS
    local = tmp_path / "adapter"
    store.download_prefix(layout.artifact_prefix(TENANT_ID, spec.job_id, "adapter"), local)
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), local)
    # the adapter names its base by where it was registered from, not the platform's alias
    assert model.peft_config["default"].base_model_name_or_path == str(tiny_model_dir)
    loaded = {n: p for n, p in model.named_parameters() if "lora_B" in n}
    assert loaded and any(float(p.abs().sum()) > 0 for p in loaded.values())
    standalone = AutoPeftModelForCausalLM.from_pretrained(local)  # no other argument
    assert all(torch.equal(p, standalone.get_parameter(n)) for n, p in loaded.items())
    metadata = json.loads((local / "tuneforge.json").read_text())
    assert metadata == {"job_id": spec.job_id, "base_model": BASE_MODEL_NAME, "base_model_sha256": BASE_MODEL_SHA,
                        "base_model_source": str(tiny_model_dir)}
    # the model card: what the weights came from, how they were trained, what came of it
    card = (local / "README.md").read_text()
    assert card.startswith("---\nbase_model: ") and "library_name: peft" in card
    assert f"`{BASE_MODEL_SHA}`" in card and "| training | file-train |" in card
    assert "| learning_rate | 0.0100 |" in card and "| n_epochs | 1 |" in card
    rows = list(csv.DictReader(io.StringIO(store.get_bytes(layout.results_key(TENANT_ID, spec.job_id)).decode())))
    assert f"| train_loss | {float(rows[-1]['train_loss']):.4f} |" in card and f"| steps | {rows[-1]['step']} |" in card
    assert "AutoPeftModelForCausalLM.from_pretrained" in card
    assert "## Evaluation" not in card  # no eval asked for


@pytest.mark.parametrize("corrupt_newest", [False, True])
def test_interrupted_and_resumed_run_is_bit_identical(
    tmp_path: Path, tiny_model_dir: Path, corrupt_newest: bool
) -> None:
    # Dropout and gradient accumulation on, so RNG and micro-batching must resume exactly.
    options = {
        "validation": demo_examples(n_keys=12)[:4],
        "hyperparameters": {"n_epochs": 3, "batch_size": 4, "micro_batch_size": 2, "warmup_ratio": 0.2},
        "lora": {"dropout": 0.1},
        "checkpoint": {"every_steps": 3, "keep_last": 3},
    }
    whole, whole_store = stage_job(tmp_path / "whole", tiny_model_dir, **options)
    whole_reporter = RecordingReporter()
    assert run_attempt(whole, whole_store, whole_reporter) == TrainerExit.SUCCESS

    first, store = stage_job(tmp_path / "split", tiny_model_dir, extra={"stop_after_step": 4}, **options)
    first_reporter = RecordingReporter()
    assert run_attempt(first, store, first_reporter) == TrainerExit.PREEMPTED
    assert [c["step"] for c in first_reporter.of_kind("checkpoints")] == [3, 4]
    if corrupt_newest:
        step4 = layout.checkpoint_prefix(TENANT_ID, first.job_id, 4)
        store.put_bytes(f"{step4}/state-__0_0.distcp", b"garbage")  # the optimizer's and weights' file

    second_reporter = RecordingReporter(attempt=2)
    assert run_attempt(next_attempt(first), store, second_reporter) == TrainerExit.SUCCESS
    resumed_from = 3 if corrupt_newest else 4
    messages = [e["message"] for e in second_reporter.events("message")]
    assert f"resumed from the checkpoint at step {resumed_from}" in messages
    assert second_reporter.events("metrics")[0]["data"]["step"] == resumed_from + 1

    # Same per-step losses and accuracies (the CSV holds full float precision) ...
    assert _results(store, first) == _results(whole_store, whole)
    # ... and the same adapter, bit for bit.
    expected, got = _adapter(whole_store, whole), _adapter(store, first)
    assert expected.keys() == got.keys()
    assert all(torch.equal(expected[name], got[name]) for name in expected)
    # Tokens trained before the interruption count too.
    trained_tokens = [r.of_kind("result")[0]["trained_tokens"] for r in (second_reporter, whole_reporter)]
    assert trained_tokens[0] == trained_tokens[1]


@pytest.mark.parametrize(
    ("training", "code", "line"),
    [
        (jsonl_bytes(demo_examples(3)) + b"{not json\n", "invalid_json", 4),
        (
            jsonl_bytes(demo_examples(1)) + b"\n" + jsonl_bytes([{"messages": [{"role": "bot", "content": "x"}]}]),
            "invalid_role", 3,
        ),
    ],
)
def test_bad_training_line_fails_with_its_code_and_line(
    tmp_path: Path, tiny_model_dir: Path, training: bytes, code: str, line: int
) -> None:
    spec, store = stage_job(tmp_path, tiny_model_dir, training=training)
    reporter = RecordingReporter()
    assert run_attempt(spec, store, reporter) == TrainerExit.USER_ERROR
    failure = reporter.of_kind("failure")[0]
    assert failure["code"] == code
    assert failure["message"].startswith(f"line {line}: training file: ")


def test_divergence_is_a_user_error(tmp_path: Path, tiny_model_dir: Path) -> None:
    spec, store = stage_job(tmp_path, tiny_model_dir, hyperparameters={"learning_rate": 1e30})
    reporter = RecordingReporter()
    assert run_attempt(spec, store, reporter) == TrainerExit.USER_ERROR
    failure = reporter.of_kind("failure")[0]
    assert failure["code"] == "training_diverged"
    assert "not finite" in failure["message"]
    assert not reporter.of_kind("result")


def test_cancel_from_heartbeat_checkpoints_and_exits_preempted(tmp_path: Path, tiny_model_dir: Path) -> None:
    spec, store = stage_job(tmp_path, tiny_model_dir)
    reporter = RecordingReporter(stop_at_step=2)
    assert run_attempt(spec, store, reporter) == TrainerExit.PREEMPTED
    assert [c["step"] for c in reporter.of_kind("checkpoints")] == [2]
    assert reporter.events("message")[-1]["data"] == {"step": 2, "reason": "cancelled"}
    assert not reporter.of_kind("result")


def test_fenced_attempt_stops_without_writing(tmp_path: Path, tiny_model_dir: Path) -> None:
    spec, store = stage_job(tmp_path, tiny_model_dir, checkpoint={"every_steps": 2})
    reporter = RecordingReporter(fence_at_step=2)
    assert run_attempt(spec, store, reporter) == TrainerExit.FENCED
    assert store.list(layout.job_prefix(TENANT_ID, spec.job_id)) == []
    assert not reporter.of_kind("failure") and not reporter.of_kind("checkpoints")


def test_prompt_completion_data_trains(tmp_path: Path, tiny_model_dir: Path) -> None:
    pairs = [{"prompt": f"Q{n}: ", "completion": f"A{n}"} for n in range(6)]
    spec, store = stage_job(tmp_path, tiny_model_dir, training=pairs)
    reporter = RecordingReporter()
    assert run_attempt(spec, store, reporter) == TrainerExit.SUCCESS
    assert reporter.of_kind("result")[0]["metrics"]["steps"] == 4


def test_unsupported_training_type_is_refused(tmp_path: Path, tiny_model_dir: Path) -> None:
    spec, store = stage_job(tmp_path, tiny_model_dir)
    reporter = RecordingReporter()
    assert run_attempt(replace(spec, training_type="prefix-tuning"), store, reporter) == TrainerExit.USER_ERROR
    assert reporter.of_kind("failure")[0]["code"] == "unsupported_method"
    # QLoRA on a trainer without a CUDA GPU: a user error that says why, not a crash
    qlora = RecordingReporter()
    assert run_attempt(replace(spec, training_type="qlora"), store, qlora) == TrainerExit.USER_ERROR
    [failure] = qlora.of_kind("failure")
    assert failure["code"] == "unsupported_method" and "CUDA" in failure["message"]
