"""The training engine across decoder architectures.

For a tiny random model of each architecture (`tests/helpers/archs.py`: Llama, Mistral,
Qwen2, Qwen3, Gemma 2, Gemma 3 text, Phi-3, GPT-NeoX, GPT-2 and the Qwen3 mixture of
experts), LoRA and full fine-tuning
  0. pack examples into rows without one example seeing another, or a token more than
     the model's own attention would (sliding windows included);
  1. train through the platform's trainer (`run_attempt`): finite falling loss, every
     trained weight moved; the same steps with gradient checkpointing, and without packing;
  2. resume from a checkpoint to the very weights of an uninterrupted run;
  3. export merged weights that give the trained model's logits (`registry/export.py`);
  4. are served by the inference engine as transformers generates.

One uninterrupted run per (architecture, training type) is trained once for the module
(`trained`) and read by every test after it; the resume test trains the same job again,
interrupted, and compares.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch
import torch

from tests.helpers.archs import ARCHITECTURES, build_arch_model
from tests.helpers.lora import greedy_ids, reference_logits
from tests.helpers.tiny import BASE_MODEL_SHA, TENANT_ID, next_attempt, stage_job
from tuneforge.data.tokenize import tokenize_example
from tuneforge.demo.dataset import demo_examples
from tuneforge.domain.exit_codes import TrainerExit
from tuneforge.domain.spec import JobSpec
from tuneforge.serve.params import ADAPTER, FULL_MODEL, ModelTarget, Prompt, SamplingParams
from tuneforge.storage import layout
from tuneforge.storage.store import FsspecStore
from tuneforge.train import checkpoint as ckpt
from tuneforge.train.reporter import RecordingReporter
from tuneforge.train.runner import run_attempt

ARCHS = list(ARCHITECTURES)
TRAINING_TYPES = ("lora", "full")
MATRIX = [pytest.param(arch, kind, id=f"{arch}-{kind}") for arch in ARCHS for kind in TRAINING_TYPES]

EXAMPLES = demo_examples(n_keys=12)  # 54-57 tokens each: two share a packed row of 128
STEPS = 6  # 2 epochs of 12 examples in batches of 4
# Dropout, warmup and gradient accumulation (4 examples = 2 packed rows, one per micro-batch)
# are on, so RNG states, schedules and micro-batching must all come back exactly on resume.
OPTIONS: dict[str, Any] = {
    "validation": EXAMPLES[:4],
    "lora": {"dropout": 0.1},
    "checkpoint": {"every_steps": 3, "keep_last": 3},
}
HYPERPARAMETERS = {"n_epochs": 2, "batch_size": 4, "micro_batch_size": 1, "max_seq_length": 128,
                   "warmup_ratio": 0.2}
LEARNING_RATES = {"lora": 1e-2, "full": 1e-3}
STOP_AFTER_STEP = 4  # mid-epoch, one step after the scheduled checkpoint at step 3


@pytest.fixture(scope="session")
def arch_model_dir(tmp_path_factory: pytest.TempPathFactory):
    """`arch_model_dir(arch)`: the folder of that architecture's tiny model, built on first use."""
    built: dict[str, Path] = {}

    def get(arch: str) -> Path:
        if arch not in built:
            built[arch] = build_arch_model(arch, tmp_path_factory.mktemp(f"arch-{arch}") / "model")
        return built[arch]

    return get


@dataclass(frozen=True)
class Trained:
    model_dir: Path  # the base model
    spec: JobSpec
    store: FsspecStore
    reporter: RecordingReporter
    exit_code: TrainerExit


def _stage(root: Path, model_dir: Path, training_type: str, **extra: Any) -> tuple[JobSpec, FsspecStore]:
    spec, store = stage_job(root, model_dir, training=EXAMPLES,
                            hyperparameters={**HYPERPARAMETERS, "learning_rate": LEARNING_RATES[training_type]},
                            **OPTIONS, **extra)
    return replace(spec, training_type=training_type), store


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, arch_model_dir):
    """`trained(arch, training_type)`: the uninterrupted run of that job, trained on first use."""
    runs: dict[tuple[str, str], Trained] = {}

    def get(arch: str, training_type: str) -> Trained:
        if (arch, training_type) not in runs:
            model_dir = arch_model_dir(arch)
            spec, store = _stage(tmp_path_factory.mktemp(f"run-{arch}-{training_type}"), model_dir, training_type)
            reporter = RecordingReporter()
            code = run_attempt(spec, store, reporter)
            runs[arch, training_type] = Trained(model_dir, spec, store, reporter, code)
        run = runs[arch, training_type]
        # every test on a run needs it to have trained; the failure report says why when it did not
        assert run.exit_code == TrainerExit.SUCCESS, run.reporter.of_kind("failure")
        return run

    return get


def _artifact_prefix(spec: JobSpec) -> str:
    return layout.artifact_prefix(spec.tenant_id, spec.job_id, "adapter" if spec.training_type == "lora" else "model")


def _weights(store: FsspecStore, spec: JobSpec) -> dict[str, torch.Tensor]:
    """The trained weights the job stored: the adapter, or the full model."""
    name = "adapter_model.safetensors" if spec.training_type == "lora" else "model.safetensors"
    return safetensors.torch.load(store.get_bytes(f"{_artifact_prefix(spec)}/{name}"))


def _results(store: FsspecStore, spec: JobSpec) -> list[dict[str, str]]:
    text = store.get_bytes(layout.results_key(spec.tenant_id, spec.job_id)).decode()
    return list(csv.DictReader(io.StringIO(text)))


def _tokenizer(model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def _first_steps(reporter: RecordingReporter, count: int) -> list[tuple[float, float]]:
    return [(m["train_loss"], m["grad_norm"]) for m in (e["data"] for e in reporter.events("metrics"))][:count]


def _adaptable_modules(model_dir: Path) -> int:
    """Linear layers (and GPT-2 style Conv1D) of the base model other than the output head:
    what 'all-linear' adapts."""
    from transformers import AutoModelForCausalLM
    from transformers.pytorch_utils import Conv1D

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    head = model.get_output_embeddings()
    return sum(isinstance(m, (torch.nn.Linear, Conv1D)) and m is not head for m in model.modules())


# -- 0. packing: a packed row attends like its examples read alone ---------------------------------


# gemma2 soft-caps its attention scores, which the variable-length attention does not: it packs
# with the mask
MASK_ONLY = {"gemma2"}


@pytest.mark.parametrize("path", ["mask", "varlen"])
@pytest.mark.parametrize("arch", ARCHS)
def test_packed_rows_give_each_example_the_logits_it_has_alone(arch: str, path: str, arch_model_dir) -> None:
    """Both ways of keeping packed examples apart. The block mask must follow the model's
    attention: its sliding windows (mistral, gemma2, gemma3) and the mask form its attention
    implementation takes (gemma2 runs eager attention, which adds the mask to the scores). The
    variable-length attention (train/attention.py) cuts each example out by its position ids,
    with its window; the trainer takes it where its self-check passes."""
    from tuneforge.train import attention
    from tuneforge.train.batches import collate_packed, packed_mask_options
    from tuneforge.train.model import load_base_model

    model, tokenizer = load_base_model(arch_model_dir(arch), torch.device("cpu"))
    if path == "varlen":
        chosen = attention.choose(model)
        assert (chosen == attention.VARLEN) == (arch not in MASK_ONLY), chosen
        if chosen != attention.VARLEN:
            return
        assert packed_mask_options(model) == {"block_mask": False}
    model.eval()
    examples = [tokenize_example(e, tokenizer, max_seq_length=128) for e in EXAMPLES[:3]]
    window = ARCHITECTURES[arch].get("sliding_window")
    assert window is None or all(len(e.input_ids) > 2 * window for e in examples)  # the window matters
    batch = collate_packed([examples], tokenizer.pad_token_id, torch.device("cpu"), **packed_mask_options(model))
    with torch.no_grad():
        packed = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                       position_ids=batch.position_ids, use_cache=False).logits[0]
        start = 0
        for example in examples:
            size = len(example.input_ids)
            alone = model(input_ids=torch.tensor([example.input_ids])).logits[0]
            torch.testing.assert_close(packed[start:start + size], alone, rtol=1e-4, atol=1e-5)
            start += size


# -- 1. training -------------------------------------------------------------------------------


@pytest.mark.parametrize(("arch", "training_type"), MATRIX)
def test_trains_with_finite_falling_loss_and_changes_the_weights(arch: str, training_type: str, trained) -> None:
    run = trained(arch, training_type)
    metrics = [event["data"] for event in run.reporter.events("metrics")]
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    losses = [m["train_loss"] for m in metrics]
    assert all(math.isfinite(loss) and loss > 0 for loss in losses), losses
    assert all(math.isfinite(m["grad_norm"]) and m["grad_norm"] > 0 for m in metrics)
    assert losses[-1] < losses[0], losses
    assert [m["step"] for m in metrics if "valid_loss" in m] == [3, 6]
    assert all(math.isfinite(m["valid_loss"]) for m in metrics if "valid_loss" in m)
    result = run.reporter.of_kind("result")[0]
    assert result["artifact_kind"] == ("adapter" if training_type == "lora" else "model")
    assert result["adapter_prefix"] == _artifact_prefix(run.spec)
    assert result["trained_tokens"] == 2 * sum(len(tokenize_example(e, _tokenizer(run.model_dir),
                                                                  max_seq_length=128).input_ids) for e in EXAMPLES)

    trained_weights = _weights(run.store, run.spec)
    if training_type == "lora":
        # every linear layer but the head is adapted, and every B (zero at the start) has moved
        lora_b = {name: t for name, t in trained_weights.items() if "lora_B" in name}
        assert len(lora_b) == _adaptable_modules(run.model_dir)
        assert all(float(t.abs().max()) > 0 for t in lora_b.values()), [n for n, t in lora_b.items() if not t.any()]
    else:
        base = safetensors.torch.load((run.model_dir / "model.safetensors").read_bytes())
        assert trained_weights.keys() == base.keys()
        unchanged = [name for name in base if torch.equal(base[name], trained_weights[name])]
        assert unchanged == []


@pytest.mark.parametrize("arch", ARCHS)
def test_a_packed_step_computes_what_an_unpacked_one_does(arch: str, trained, tmp_path: Path) -> None:
    """The mask the trainer builds for its packed rows is the one the model needs: the first
    full fine-tuning step (no dropout) has the same loss and gradient norm without packing."""
    packed = trained(arch, "full")
    spec, store = _stage(tmp_path, packed.model_dir, "full", extra={"stop_after_step": 1})
    spec = replace(spec, hyperparameters=replace(spec.hyperparameters, packing=False))
    reporter = RecordingReporter()
    assert run_attempt(spec, store, reporter) == TrainerExit.PREEMPTED, reporter.of_kind("failure")
    [(loss, grad_norm)] = _first_steps(reporter, 1)
    [(packed_loss, packed_grad_norm)] = _first_steps(packed.reporter, 1)
    assert loss == pytest.approx(packed_loss, rel=1e-5)
    assert grad_norm == pytest.approx(packed_grad_norm, rel=1e-4)


@pytest.mark.parametrize(("arch", "training_type"), MATRIX)
def test_gradient_checkpointing_trains_the_same_steps(arch: str, training_type: str, trained, tmp_path: Path) -> None:
    """What the memory planner turns on for a job that would not fit: recomputing activations
    in the backward pass changes nothing the steps compute (dropout included)."""
    plain = trained(arch, training_type)
    spec, store = _stage(tmp_path, plain.model_dir, training_type, extra={"stop_after_step": 2})
    reporter = RecordingReporter()
    assert run_attempt(replace(spec, gradient_checkpointing=True), store, reporter) == TrainerExit.PREEMPTED, \
        reporter.of_kind("failure")
    steps, expected = _first_steps(reporter, 2), _first_steps(plain.reporter, 2)
    assert len(steps) == 2
    for (loss, grad_norm), (want_loss, want_grad_norm) in zip(steps, expected):
        assert loss == pytest.approx(want_loss, rel=1e-5)
        assert grad_norm == pytest.approx(want_grad_norm, rel=1e-4)


# -- 2. exact resume ---------------------------------------------------------------------------


@pytest.mark.parametrize(("arch", "training_type"), MATRIX)
def test_interrupted_and_resumed_run_equals_the_uninterrupted_one_bit_for_bit(
    arch: str, training_type: str, trained, tmp_path: Path
) -> None:
    whole = trained(arch, training_type)
    first, store = _stage(tmp_path, whole.model_dir, training_type, extra={"stop_after_step": STOP_AFTER_STEP})
    first_reporter = RecordingReporter()
    assert run_attempt(first, store, first_reporter) == TrainerExit.PREEMPTED
    assert [c["step"] for c in first_reporter.of_kind("checkpoints")] == [3, STOP_AFTER_STEP]
    newest = ckpt.latest_valid_checkpoint(store, layout.checkpoints_prefix(TENANT_ID, first.job_id))
    assert newest is not None and newest.step == STOP_AFTER_STEP
    # weights and optimizer through torch.distributed.checkpoint; an adapter also whole, for serving
    assert {ckpt.STATE_PREFIX + ".metadata", ckpt.STATE_PREFIX + "__0_0.distcp"} <= newest.files.keys()
    assert (ckpt.ADAPTER_WEIGHTS in newest.files) == (training_type == "lora")

    second_reporter = RecordingReporter(attempt=2)
    assert run_attempt(next_attempt(first), store, second_reporter) == TrainerExit.SUCCESS, \
        second_reporter.of_kind("failure")
    messages = [e["message"] for e in second_reporter.events("message")]
    assert f"resumed from the checkpoint at step {STOP_AFTER_STEP}" in messages
    assert [e["data"]["step"] for e in second_reporter.events("metrics")] == list(range(STOP_AFTER_STEP + 1,
                                                                                      STEPS + 1))
    # the same per-step losses and accuracies (the CSV holds full float precision) ...
    assert _results(store, first) == _results(whole.store, whole.spec)
    # ... and the same final weights, bit for bit
    expected, got = _weights(whole.store, whole.spec), _weights(store, first)
    assert expected.keys() == got.keys()
    differing = [name for name in expected if not torch.equal(expected[name], got[name])]
    assert differing == []
    trained_tokens = [r.of_kind("result")[0]["trained_tokens"] for r in (second_reporter, whole.reporter)]
    assert trained_tokens[0] == trained_tokens[1]


# -- 3. merged export --------------------------------------------------------------------------


def _registered_row(run: Trained):
    from tuneforge.db.tables import FineTunedModel
    from tuneforge.registry import lineage

    prefix = _artifact_prefix(run.spec)
    return FineTunedModel(
        model_id=f"ft:{run.spec.base_model.name}:{TENANT_ID}::{run.spec.job_id}", tenant_id=TENANT_ID,
        job_id=run.spec.job_id, base_model=run.spec.base_model.name, base_model_sha256=BASE_MODEL_SHA,
        artifact_prefix=prefix, created_at=0, artifact_kind="adapter" if run.spec.training_type == "lora" else "model",
        lineage={"artifact": {"files": lineage.artifact_digests(run.store, prefix)}},
    )


def _reference(run: Trained, local: Path):
    """The trained model as transformers + PEFT load it from the job's artifact: base and
    adapter for LoRA, the saved weights for a full fine-tune."""
    from transformers import AutoModelForCausalLM

    run.store.download_prefix(_artifact_prefix(run.spec), local)
    if run.spec.training_type == "full":
        return AutoModelForCausalLM.from_pretrained(local).eval()
    from peft import PeftModel

    return PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(run.model_dir), str(local)).eval()


def _probe_ids(run: Trained) -> list[int]:
    return tokenize_example(EXAMPLES[0], _tokenizer(run.model_dir), max_seq_length=128).input_ids


@pytest.mark.parametrize(("arch", "training_type"), MATRIX)
def test_merged_export_gives_the_logits_of_the_trained_model(
    arch: str, training_type: str, trained, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    from tuneforge.registry import export

    run = trained(arch, training_type)
    prefix = export.build_merged(run.store, _registered_row(run), BASE_MODEL_SHA, run.spec.base_model.prefix, "fp32",
                                 tmp_path / "cache")
    folder = tmp_path / "merged"
    run.store.download_prefix(prefix, folder)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in folder.iterdir()}
    merged = AutoModelForCausalLM.from_pretrained(folder).eval()  # transformers alone, no PEFT
    assert merged.config.model_type == arch
    ids = _probe_ids(run)
    want = reference_logits(_reference(run, tmp_path / "artifact"), ids)
    got = reference_logits(merged, ids)
    base = reference_logits(AutoModelForCausalLM.from_pretrained(run.model_dir).eval(), ids)
    assert (want - base).abs().mean() > 1e-3  # training really changed the model's outputs
    assert (want - got).abs().max() < 1e-4 and (want - got).abs().mean() < 1e-5


# -- 4. serving --------------------------------------------------------------------------------


@pytest.mark.parametrize(("arch", "training_type"), MATRIX)
def test_the_engine_serves_the_trained_model_as_transformers_generates(
    arch: str, training_type: str, trained, tmp_path: Path
) -> None:
    from tuneforge.serve.engine import InferenceEngine

    run = trained(arch, training_type)
    kind = ADAPTER if training_type == "lora" else FULL_MODEL
    target = ModelTarget(f"ft:{arch}:{training_type}", run.spec.base_model, artifact_prefix=_artifact_prefix(run.spec),
                         artifact_kind=kind)
    engine = InferenceEngine(run.store, cache_dir=tmp_path / "cache", device="cpu", max_models=2)
    reference = _reference(run, tmp_path / "artifact")
    tokenizer = _tokenizer(run.model_dir)

    # the weights a request runs on are the trained ones, adapter on base or full model
    ids = _probe_ids(run)
    served = engine.logits(target, ids)
    torch.testing.assert_close(served, reference_logits(reference, ids), rtol=1e-4, atol=1e-5)
    base = engine.logits(ModelTarget("base", run.spec.base_model), ids)
    assert (served - base).abs().mean() > 1e-3

    messages = tuple(EXAMPLES[0]["messages"][:-1])  # system and user: the answer is to come
    prompt_ids = tokenizer.apply_chat_template(list(messages), tokenize=True, add_generation_prompt=True,
                                               return_dict=True)["input_ids"]
    completion = engine.complete(target, Prompt(messages=messages), SamplingParams(max_new_tokens=8, temperature=0.0))
    expected = greedy_ids(reference, prompt_ids, 8, tokenizer.eos_token_id)
    assert completion.usage.prompt_tokens == len(prompt_ids)
    assert completion.usage.completion_tokens == len(expected) >= 1
    assert completion.text == tokenizer.decode(expected, skip_special_tokens=True)
    assert completion.finish_reason == ("stop" if expected[-1] == tokenizer.eos_token_id else "length")
    stats = engine.stats()
    if kind == ADAPTER:
        assert (stats["base_loads"], stats["adapter_loads"]) == (1, 1)
    else:
        assert (stats["full_model_loads"], stats["base_loads"]) == (1, 1)


@pytest.mark.parametrize("arch", ARCHS)
def test_rollouts_sampled_over_the_cache_draw_what_a_full_recompute_would(arch: str, arch_model_dir) -> None:
    """Reinforcement's batched sampler (left padding, position ids, the key/value cache) against the
    same draws from logits recomputed over the whole padded batch at every token, and the first
    token's distribution against each prompt alone, unpadded."""
    from tuneforge.train import sampling
    from tuneforge.train.model import load_base_model

    model, tokenizer = load_base_model(arch_model_dir(arch), torch.device("cpu"))
    model.eval()
    distinct = [tokenizer("the quick brown fox jumps")["input_ids"], tokenizer("hello")["input_ids"],
                tokenizer("a b c d e f g h i j k")["input_ids"]]
    prompts = [prompt for prompt in distinct for _ in range(2)]  # groups of 2: their prefill is shared
    options = dict(max_new_tokens=8, temperature=1.0, eos_ids={tokenizer.eos_token_id}, pad_id=tokenizer.pad_token_id,
                   device=torch.device("cpu"))
    cached = sampling.sample(model, prompts, generator=torch.Generator().manual_seed(3), **options)

    class Uncached(torch.nn.Module):  # the whole sequence again at each token: no cache to get wrong
        def __init__(self) -> None:
            super().__init__()
            self.seen: torch.Tensor | None = None
            self.mask: torch.Tensor | None = None

        def forward(self, input_ids, attention_mask, position_ids, past_key_values=None, use_cache=True):  # noqa: ANN001
            prefill = input_ids.shape[1] > 1  # (a prefill's rows: all of them, since no cache comes back)
            self.seen = input_ids if prefill else torch.cat([self.seen, input_ids], dim=1)
            positions = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
            with torch.no_grad():
                return model(input_ids=self.seen, attention_mask=attention_mask, position_ids=positions,
                             use_cache=False)  # (no cache to share either: every prompt row is computed)

    recomputed = sampling.sample(Uncached(), prompts, generator=torch.Generator().manual_seed(3), **options)
    assert cached.token_ids == recomputed.token_ids and any(len(ids) > 1 for ids in cached.token_ids)
    with torch.no_grad():
        batch = tokenizer.pad({"input_ids": prompts}, padding_side="left", return_tensors="pt")
        positions = (batch["attention_mask"].cumsum(dim=1) - 1).clamp(min=0)
        padded = model(**batch, position_ids=positions).logits
        for row, prompt in enumerate(prompts):
            alone = model(input_ids=torch.tensor([prompt])).logits[0, -1]
            assert torch.allclose(torch.softmax(alone, -1), torch.softmax(padded[row, -1], -1), atol=1e-4), row


def _lora_of(arch: str, arch_model_dir) -> tuple[Any, Any]:
    """The arch's model under a LoRA adapter on every linear layer, its B matrices drawn (not 0)."""
    from tuneforge.domain.spec import LoraConfig
    from tuneforge.train.model import load_base_model, prepare_trainable

    torch.manual_seed(0)
    base, tokenizer = load_base_model(arch_model_dir(arch), torch.device("cpu"))
    model = prepare_trainable(base, "lora", LoraConfig(rank=4, alpha=8), seed=0)  # as the trainer adapts it
    for name, parameter in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(parameter, std=0.05)
    return model, tokenizer


@pytest.mark.parametrize("arch", ARCHS)
def test_the_reinforcement_loss_with_each_prompt_computed_once_equals_the_full_pass(arch: str, arch_model_dir) -> None:
    """Log-probabilities and gradients of a chunk of groups (prompts of different lengths, completions
    ending early) with each group's prompt computed once, against every row computed whole."""
    from tuneforge.train.objectives import reinforcement as rl

    model, tokenizer = _lora_of(arch, arch_model_dir)
    model.train()
    prompts = [tokenizer("the quick brown fox jumps")["input_ids"], tokenizer("hello")["input_ids"]]
    completions = [[5, 9, 11, 3], [7], [12, 13, 14, 15, 16, 17], [8, 8]]
    chunk = [rl.Rollout(prompts[row // 2], completion, 0.5 - row / 4, 0.1)
             for row, completion in enumerate(completions)]
    pad = tokenizer.pad_token_id
    batch = rl._batch(chunk, pad, torch.device("cpu"))
    outcomes = {}
    for shared in (None, rl._Shared(chunk, 2, pad)):
        model.zero_grad()
        logps = rl._token_logps(model, batch, shared)
        logps.sum().backward()
        outcomes[shared is None] = (logps.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                                                     if p.grad is not None})
    (whole, whole_grads), (once, once_grads) = outcomes[True], outcomes[False]
    assert torch.allclose(whole, once, atol=2e-5), (whole - once).abs().max()
    assert int((once != 0).sum()) == sum(len(c) for c in completions)
    assert whole_grads.keys() == once_grads.keys() and whole_grads
    assert all(torch.allclose(whole_grads[n], once_grads[n], atol=2e-5, rtol=1e-3) for n in whole_grads)


@pytest.mark.parametrize("arch", ARCHS)
def test_rollouts_through_the_merged_adapter_draw_what_the_adapter_does_and_leave_the_weights(
        arch: str, arch_model_dir, monkeypatch) -> None:
    from tuneforge.train import sampling

    model, tokenizer = _lora_of(arch, arch_model_dir)
    model.eval()
    before = {name: (parameter, parameter.detach().clone()) for name, parameter in model.named_parameters()}
    assert sampling._mergeable(model)
    prompts = [tokenizer("the quick brown fox jumps")["input_ids"]] * 2 + [tokenizer("hello")["input_ids"]] * 2
    options = dict(max_new_tokens=8, temperature=1.0, eos_ids={tokenizer.eos_token_id}, pad_id=tokenizer.pad_token_id,
                   device=torch.device("cpu"))
    merged = sampling.sample(model, prompts, generator=torch.Generator().manual_seed(5), **options)
    after = dict(model.named_parameters())
    assert all(after[name] is parameter and torch.equal(parameter, value)
               for name, (parameter, value) in before.items())
    monkeypatch.setattr(sampling, "MERGED_COPY_BYTES", 0)  # no room for the copy: the adapters sample as they are
    assert sampling._mergeable(model) == []
    unmerged = sampling.sample(model, prompts, generator=torch.Generator().manual_seed(5), **options)
    assert merged.token_ids == unmerged.token_ids and any(len(ids) > 1 for ids in merged.token_ids)
