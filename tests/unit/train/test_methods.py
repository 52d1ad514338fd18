"""DPO, ORPO and continued pre-training on the tiny model: each does what it promises.

- DPO / ORPO: pairs whose chosen answer starts with "good" and rejected with
  "bad" (prompts and the rest of the answer random). On held-out pairs with
  new prompts, the trained adapter's log-probability margin of chosen over
  rejected grows well above the base model's, and DPO's validation loss falls
  below log 2 (its value when the policy equals the reference).
- CPT: text in a small made-up language; held-out perplexity falls.
- Exact resume holds for DPO like for supervised training.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace
from pathlib import Path

import pytest
import safetensors.torch
import torch

from tests.helpers.tiny import next_attempt, stage_job
from tuneforge.domain.exit_codes import TrainerExit
from tuneforge.storage import layout
from tuneforge.train.model import load_base_model
from tuneforge.train.objectives.cpt import tokenize_text
from tuneforge.train.pairs import tokenize_pair
from tuneforge.train.reporter import RecordingReporter
from tuneforge.train.runner import run_attempt

WORDS = "river stone cloud amber maple falcon copper violet harbor lantern meadow silver".split()


def preference_pairs(count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    pairs = []
    for _ in range(count):
        prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 5)))
        tail = " ".join(rng.choice(WORDS) for _ in range(2))
        pairs.append({"input": {"messages": [{"role": "user", "content": prompt}]},
                      "preferred_output": [{"role": "assistant", "content": f"good {tail}"}],
                      "non_preferred_output": [{"role": "assistant", "content": f"bad {tail}"}]})
    return pairs


def _sequence_logp(model, example) -> float:
    ids = torch.tensor([example.input_ids])
    labels = torch.tensor(example.labels[1:])
    with torch.no_grad():
        logps = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), dim=-1)
    mask = labels != -100
    return float(logps[torch.arange(len(labels))[mask], labels[mask]].sum())


def mean_margin(model, tokenizer, pairs: list[dict]) -> float:
    margins = []
    for record in pairs:
        chosen, rejected = tokenize_pair(record, tokenizer, max_seq_length=128)
        margins.append(_sequence_logp(model, chosen) - _sequence_logp(model, rejected))
    return sum(margins) / len(margins)


def _trained(tiny_model_dir: Path, store, spec, local: Path):
    from peft import PeftModel

    base, tokenizer = load_base_model(tiny_model_dir, torch.device("cpu"))
    store.download_prefix(layout.artifact_prefix(spec.tenant_id, spec.job_id, "adapter"), local)
    return PeftModel.from_pretrained(base, str(local)).eval(), tokenizer


@pytest.mark.parametrize("method", ["dpo", "orpo", "simpo"])
def test_preference_training_widens_the_held_out_margin(tmp_path: Path, tiny_model_dir: Path, method: str) -> None:
    train, held_out = preference_pairs(48, seed=1), preference_pairs(16, seed=2)
    spec, store = stage_job(tmp_path, tiny_model_dir, training=train, validation=held_out,
                            hyperparameters={"n_epochs": 4, "batch_size": 8, "micro_batch_size": 4,
                                             "learning_rate": 5e-3, "beta": 0.5})
    spec = replace(spec, method=method)
    reporter = RecordingReporter()
    assert run_attempt(spec, store, reporter) == TrainerExit.SUCCESS, reporter.reports[-3:]
    base, tokenizer = load_base_model(tiny_model_dir, torch.device("cpu"))
    before = mean_margin(base.eval(), tokenizer, held_out)
    model, _ = _trained(tiny_model_dir, store, spec, tmp_path / "adapter")
    after = mean_margin(model, tokenizer, held_out)
    assert after > before + 2.0, (before, after)  # nats: chosen now far likelier than rejected
    [result] = reporter.of_kind("result")
    assert result["metrics"]["valid_mean_token_accuracy"] >= 0.9  # share of held-out pairs preferring chosen
    if method == "dpo":
        assert result["metrics"]["valid_loss"] < math.log(2) - 0.2
        references = [key for key in store.list(layout.tenant_prefix(spec.tenant_id)) if "reference-logps" in key]
        assert len(references) == 2  # training and validation pairs, computed once with the adapter off


def assert_resumes_exactly(tmp_path: Path, tiny_model_dir: Path, method: str, options: dict,
                           stop_after_step: int) -> None:
    """A run stopped after `stop_after_step` and resumed gives every step's loss and the final
    adapter of an uninterrupted run, bit for bit."""
    whole, store = stage_job(tmp_path / "whole", tiny_model_dir, **options)
    reference = RecordingReporter()
    assert run_attempt(replace(whole, method=method), store, reference) == TrainerExit.SUCCESS
    first, store2 = stage_job(tmp_path / "split", tiny_model_dir, extra={"stop_after_step": stop_after_step},
                              **options)
    first = replace(first, method=method)
    reporter = RecordingReporter()
    assert run_attempt(first, store2, reporter) == TrainerExit.PREEMPTED
    second = RecordingReporter(attempt=2)
    assert run_attempt(next_attempt(first), store2, second) == TrainerExit.SUCCESS

    def losses(r):
        return {e["data"]["step"]: e["data"]["train_loss"] for e in r.events("metrics")}

    assert {**losses(reporter), **losses(second)} == losses(reference)
    prefix = layout.artifact_prefix(whole.tenant_id, whole.job_id, "adapter")
    a = safetensors.torch.load(store.get_bytes(f"{prefix}/adapter_model.safetensors"))
    b = safetensors.torch.load(store2.get_bytes(f"{prefix}/adapter_model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_dpo_resumes_exactly(tmp_path: Path, tiny_model_dir: Path) -> None:
    options = {"training": preference_pairs(24, seed=3),
               "hyperparameters": {"n_epochs": 2, "batch_size": 4, "micro_batch_size": 2, "beta": 0.3},
               "lora": {"dropout": 0.1}, "checkpoint": {"every_steps": 2}}
    assert_resumes_exactly(tmp_path, tiny_model_dir, "dpo", options, stop_after_step=5)


def domain_text(count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    subjects, verbs, objects = WORDS[:4], ["sees", "finds", "keeps"], WORDS[4:]
    lines = []
    for _ in range(count):
        sentences = [f"the {rng.choice(subjects)} {rng.choice(verbs)} the {rng.choice(objects)} ."
                     for _ in range(rng.randint(3, 12))]
        lines.append({"text": " ".join(sentences)})
    return lines


def _text_loss(model, tokenizer, lines: list[dict], max_seq_length: int) -> float:
    total, count = 0.0, 0
    for line in lines:
        for window in tokenize_text(line["text"], tokenizer, max_seq_length=max_seq_length):
            ids = torch.tensor([window.input_ids])
            with torch.no_grad():
                logits = model(input_ids=ids).logits[0, :-1].float()
            total += float(torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="sum"))
            count += ids.shape[1] - 1
    return total / count


def test_continued_pretraining_lowers_held_out_perplexity(tmp_path: Path, tiny_model_dir: Path) -> None:
    train, held_out = domain_text(60, seed=4), domain_text(12, seed=5)
    spec, store = stage_job(tmp_path, tiny_model_dir, training=train, validation=held_out,
                            hyperparameters={"n_epochs": 3, "batch_size": 8, "micro_batch_size": 4,
                                             "learning_rate": 5e-3, "max_seq_length": 64})
    spec = replace(spec, method="cpt")
    reporter = RecordingReporter()
    assert run_attempt(spec, store, reporter) == TrainerExit.SUCCESS, reporter.reports[-3:]
    base, tokenizer = load_base_model(tiny_model_dir, torch.device("cpu"))
    before = _text_loss(base.eval(), tokenizer, held_out, 64)
    [result] = reporter.of_kind("result")
    after = result["metrics"]["valid_loss"]
    model, _ = _trained(tiny_model_dir, store, spec, tmp_path / "adapter")
    assert _text_loss(model, tokenizer, held_out, 64) == pytest.approx(after, rel=1e-3)  # the same measure
    assert math.exp(after) < math.exp(before) / 4, (before, after)
    # long documents are cut into 64-token windows, not truncated: every token is trained on
    windows = sum(len(tokenize_text(line["text"], tokenizer, max_seq_length=64)) for line in train)
    assert windows > len(train)
    assert reporter.events("metrics")[0]["data"]["total_steps"] == 3 * math.ceil(windows / 8)


def test_a_full_fine_tune_trains_every_weight_resumes_exactly_and_loads_in_transformers(
        tmp_path: Path, tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    from tuneforge.demo.dataset import demo_examples

    options = {"training": demo_examples(n_keys=12),
               "hyperparameters": {"n_epochs": 4, "batch_size": 4, "micro_batch_size": 2, "learning_rate": 2e-3},
               "checkpoint": {"every_steps": 3}}
    whole, store = stage_job(tmp_path / "whole", tiny_model_dir, **options)
    whole = replace(whole, training_type="full")
    reference = RecordingReporter()
    assert run_attempt(whole, store, reference) == TrainerExit.SUCCESS, reference.reports[-3:]
    [result] = reference.of_kind("result")
    assert result["adapter_prefix"].endswith("/artifacts/model")
    step3 = layout.checkpoint_prefix(whole.tenant_id, whole.job_id, 9)
    assert store.exists(f"{step3}/state-.metadata") and not store.exists(f"{step3}/adapter_model.safetensors")

    first, store2 = stage_job(tmp_path / "split", tiny_model_dir, extra={"stop_after_step": 7}, **options)
    first = replace(first, training_type="full")
    interrupted = RecordingReporter()
    assert run_attempt(first, store2, interrupted) == TrainerExit.PREEMPTED
    resumed = RecordingReporter(attempt=2)
    assert run_attempt(next_attempt(first), store2, resumed) == TrainerExit.SUCCESS

    def losses(r):
        return {e["data"]["step"]: e["data"]["train_loss"] for e in r.events("metrics")}

    assert {**losses(interrupted), **losses(resumed)} == losses(reference)

    local = tmp_path / "model"
    store.download_prefix(result["adapter_prefix"], local)
    trained = AutoModelForCausalLM.from_pretrained(local, dtype=torch.float32).eval()
    base, tokenizer = load_base_model(tiny_model_dir, torch.device("cpu"))
    changed = [name for name, tensor in trained.state_dict().items()
               if not torch.equal(tensor, base.state_dict()[name])]
    assert len(changed) == len(base.state_dict())  # every weight moved, embeddings and head included
    other = tmp_path / "model2"
    store2.download_prefix(result["adapter_prefix"], other)
    again = AutoModelForCausalLM.from_pretrained(other, dtype=torch.float32)
    assert all(torch.equal(t, again.state_dict()[n]) for n, t in trained.state_dict().items())  # bit-identical
    assert losses(reference)[max(losses(reference))] < losses(reference)[1] / 2


@pytest.mark.parametrize("method", ["dpo", "orpo", "cpt"])
def test_every_method_also_trains_every_weight(tmp_path: Path, tiny_model_dir: Path, method: str) -> None:
    """Full fine-tunes of the other methods: DPO's reference is scored before the weights move."""
    from transformers import AutoModelForCausalLM

    if method == "cpt":
        train, held_out = domain_text(40, seed=6), domain_text(8, seed=7)
    else:
        train, held_out = preference_pairs(32, seed=6), preference_pairs(12, seed=7)
    spec, store = stage_job(tmp_path, tiny_model_dir, training=train, validation=held_out,
                            hyperparameters={"n_epochs": 3, "batch_size": 8, "micro_batch_size": 4,
                                             "learning_rate": 1e-3, "max_seq_length": 96,
                                             **({} if method == "cpt" else {"beta": 0.5})})  # cpt has no beta
    spec = replace(spec, method=method, training_type="full")
    reporter = RecordingReporter()
    assert run_attempt(spec, store, reporter) == TrainerExit.SUCCESS, reporter.reports[-3:]
    [result] = reporter.of_kind("result")
    store.download_prefix(result["adapter_prefix"], tmp_path / "model")
    trained = AutoModelForCausalLM.from_pretrained(tmp_path / "model", dtype=torch.float32).eval()
    base, tokenizer = load_base_model(tiny_model_dir, torch.device("cpu"))
    if method == "cpt":
        assert _text_loss(trained, tokenizer, held_out, 96) < _text_loss(base.eval(), tokenizer, held_out, 96) - 1.0
    else:
        assert mean_margin(trained, tokenizer, held_out) > mean_margin(base.eval(), tokenizer, held_out) + 2.0


@pytest.mark.parametrize("training_type", ["lora", "full"])
def test_gradient_checkpointing_recomputes_without_changing_the_result(tmp_path: Path, tiny_model_dir: Path,
                                                                       training_type: str) -> None:
    from tuneforge.demo.dataset import demo_examples

    runs = {}
    for recompute in (False, True):
        spec, store = stage_job(tmp_path / str(recompute), tiny_model_dir, training=demo_examples(n_keys=8),
                                hyperparameters={"n_epochs": 2, "batch_size": 4, "micro_batch_size": 2})
        reporter = RecordingReporter()
        spec = replace(spec, training_type=training_type, gradient_checkpointing=recompute)
        assert run_attempt(spec, store, reporter) == TrainerExit.SUCCESS
        runs[recompute] = {e["data"]["step"]: e["data"]["train_loss"] for e in reporter.events("metrics")}
    assert runs[True].keys() == runs[False].keys()
    for step, loss in runs[False].items():
        assert runs[True][step] == pytest.approx(loss, rel=1e-5)
