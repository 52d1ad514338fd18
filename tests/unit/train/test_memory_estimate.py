"""The memory estimator (`tuneforge.planning.memory`) against peak memory measured on this CPU.

How it is measured. Every configuration (model, training type, micro-batch,
sequence length) trains in a process of its own: one worker subprocess (this
file run as a script) imports torch, transformers and peft once — 6-8 s on the
test machine — and forks one child per configuration, two at a time. A child
loads the model as the trainer does (`load_base_model`, fp32 on the CPU, then
`prepare_trainable`: PEFT LoRA or every weight), makes AdamW, reads every
weight once (safetensors weights are memory-mapped and would otherwise be
paged in by the first forward, inside the measurement), resets the kernel's
high-water mark (`5` into /proc/self/clear_refs) and takes VmRSS as the
baseline; then it runs STEPS optimizer steps of ACCUMULATION micro-batches each
as the trainer's `train_step` does (packed rows of `seq_len` tokens with
the block-diagonal mask, `score_tokens`, backward, gradient clipping, AdamW,
`zero_grad(set_to_none=True)`), and reports VmHWM - baseline. The prediction
it is compared with is `MemoryEstimate.step_bytes` (the estimate less the
weights, which the baseline already holds). Two steps, because the optimizer
states appear during the first; two micro-batches a step, because the
estimate assumes gradient accumulation (gradients alive during a forward).

Allocator. glibc's malloc moves its mmap threshold up to the size of any freed
block (up to 32 MiB), after which tensors of that size come from the heap,
whose freed holes stay resident: with the default settings the peak RSS of these
runs is 1.0-2x the pinned figure, up to 3.5x in other configurations, and varies
by up to ~25% from run to run (docs/memory.md has both columns) — a property of
glibc rather than of training (a GPU run goes through PyTorch's
caching allocator instead). The worker therefore pins the threshold
(MALLOC_MMAP_THRESHOLD_=131072, glibc's own initial value; setting it turns the
adjustment off): every tensor of 128 KiB or more is then its own mapping,
returned when freed, and RSS follows tensor lifetimes.

Band. Prediction / measurement must lie within BAND = 0.75-1.33 (a factor of
4/3 either way). On the test machine the ratios were 0.84-1.05 over repeated
runs; the slack is for what no formula here models: the CPU runtime's own
memory (the 14 MiB constant is 40-70% of the smallest runs and moves by a few
MiB with the model and the run), allocator rounding, threads and Python
objects. The band is still tight enough that leaving out any major term fails
it: the loss buffers are ~40% of the long-sequence LoRA runs, gradients and
AdamW states ~40% of the full fine-tune of the larger model.

Run time: 15-40 s for the module on 2 cores, depending on other load.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytest

from tuneforge.planning.memory import (
    GIB,
    MIB,
    DoesNotFit,
    MemoryEstimate,
    ModelShape,
    choose_micro_batch,
    estimate,
    gpus_needed,
)

# Random-weight Llamas from `build_tiny_model` (vocabulary 2048: the loss buffers matter).
MODELS: dict[str, dict[str, int]] = {
    "small": {"vocab_size": 2048, "hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512},
    "medium": {"vocab_size": 2048, "hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 4,
               "num_attention_heads": 8, "num_key_value_heads": 4, "max_position_embeddings": 512},
}

STEPS = 2
ACCUMULATION = 2
BAND = (0.75, 1.33)
PINNED_ALLOCATOR = {"MALLOC_MMAP_THRESHOLD_": "131072"}
RESULT_PREFIX = "MEMORY-PROBE-RESULT "
WORKER_TIMEOUT_S = 900


@dataclass(frozen=True)
class Run:
    """One measured configuration."""

    model: str
    training_type: str
    micro_batch_size: int
    seq_len: int
    lora_rank: int = 16
    attention: str = "sdpa"
    dtype: str = "float32"  # "bfloat16": the model in bf16 (adapters stay fp32), as on a GPU
    gradient_checkpointing: bool = False

    @property
    def label(self) -> str:
        extras = [self.attention] if self.attention != "sdpa" else []
        extras += ["bf16"] if self.dtype == "bfloat16" else []
        extras += ["checkpointing"] if self.gradient_checkpointing else []
        suffix = f" ({', '.join(extras)})" if extras else ""
        return f"{self.model} {self.training_type} micro {self.micro_batch_size} seq {self.seq_len}{suffix}"

    def predict(self, shape: ModelShape) -> MemoryEstimate:
        # torch's AdamW keeps its moments in the parameters' dtype ("adamw_pure"; the same as
        # "adamw" in fp32), and on a CPU steps one tensor at a time
        return estimate(
            shape, training_type=self.training_type, micro_batch_size=self.micro_batch_size,
            seq_len=self.seq_len, lora_rank=self.lora_rank, weight_bytes=4 if self.dtype == "float32" else 2,
            optimizer="adamw_pure", attention=self.attention, gradient_checkpointing=self.gradient_checkpointing,
            device="cpu",
        )


RUNS = [
    Run("small", "lora", 1, 128),
    Run("small", "lora", 4, 128),
    Run("small", "lora", 4, 512),
    Run("small", "full", 4, 512),
    Run("medium", "lora", 1, 128),
    Run("medium", "lora", 1, 512),
    Run("medium", "full", 1, 512),
]

# (larger, smaller): a bigger micro-batch, a longer sequence, every weight instead of an adapter
ORDERINGS = [
    (RUNS[1], RUNS[0]),  # micro-batch 4 vs 1
    (RUNS[2], RUNS[1]),  # seq 512 vs 128
    (RUNS[5], RUNS[4]),  # seq 512 vs 128
    (RUNS[3], RUNS[2]),  # full vs LoRA
    (RUNS[6], RUNS[5]),  # full vs LoRA
]


def measure(model_dirs: dict[str, Path], runs: Sequence[Run], *, build: bool = True,
            allocator: dict[str, str] | None = None, shapes: Sequence[dict] = (),
            parallel: int | None = None) -> dict[str, Any]:
    """Build the models of MODELS into `model_dirs` (if `build`) and measure `runs` in the
    worker subprocess; also count the parameters transformers gives each config of `shapes`
    (on the meta device). `allocator`: extra environment of the worker (None: PINNED_ALLOCATOR;
    {}: glibc's defaults)."""
    job = {
        "models": {name: {"dir": str(model_dirs[name]), "kwargs": MODELS[name]} for name in model_dirs},
        "build": build,
        "runs": [asdict(run) for run in runs],
        "shapes": list(shapes),
        "steps": STEPS,
        "accumulation": ACCUMULATION,
        "parallel": parallel or max(1, min(2, len(os.sched_getaffinity(0)))),
    }
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1",
           **(PINNED_ALLOCATOR if allocator is None else allocator)}
    if allocator == {}:
        env.pop("MALLOC_MMAP_THRESHOLD_", None)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve())], input=json.dumps(job),
                          capture_output=True, text=True, env=env, timeout=WORKER_TIMEOUT_S, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"memory worker failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    result = json.loads(lines[-1][len(RESULT_PREFIX):])
    failed = [r["error"] for r in result["runs"] + result["builds"] + result["shapes"] if not r["ok"]]
    if failed:
        raise RuntimeError("memory worker: " + "\n".join(failed))
    result["wall_s"] = time.monotonic() - started
    return result


def model_shape(model_dir: Path) -> ModelShape:
    return ModelShape.from_config(json.loads((model_dir / "config.json").read_text()))


# -- configurations written inline (no download): Llama 2 7B and 70B, Llama 3 8B ---------------

LLAMA2_7B = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
             "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000,
             "tie_word_embeddings": False, "max_position_embeddings": 4096}
LLAMA2_70B = {"model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
              "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 32000,
              "tie_word_embeddings": False, "max_position_embeddings": 4096}
LLAMA3_8B = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
             "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
             "tie_word_embeddings": False, "max_position_embeddings": 8192}
# Small configs that exercise the other branches of the parameter count (built on the meta device).
COUNTED_CONFIGS = [
    {"model_type": "llama", "hidden_size": 96, "intermediate_size": 200, "num_hidden_layers": 3,
     "num_attention_heads": 6, "num_key_value_heads": 2, "vocab_size": 500, "tie_word_embeddings": True},
    {"model_type": "llama", "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2,
     "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 24, "vocab_size": 300,
     "attention_bias": True, "mlp_bias": True, "tie_word_embeddings": False},
    {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
     "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 400, "tie_word_embeddings": True},
    LLAMA2_7B,
]
GB80 = 80 * GIB


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Both models built once (in the worker), every run of RUNS measured in a process of its own."""
    root = tmp_path_factory.mktemp("memory-models")
    dirs = {name: root / name for name in MODELS}
    result = measure(dirs, RUNS, shapes=COUNTED_CONFIGS)
    if not all(run["hwm_reset"] for run in result["runs"]):
        pytest.skip("/proc/self/clear_refs cannot reset the peak RSS on this kernel")
    result["dirs"] = dirs
    return result


def _table(rows: list[tuple[Run, MemoryEstimate, int]]) -> str:
    lines = [f"{'configuration':42} {'predicted':>10} {'measured':>10} {'ratio':>6}"]
    for run, predicted, peak in rows:
        lines.append(f"{run.label:42} {predicted.step_bytes / MIB:9.1f}M {peak / MIB:9.1f}M "
                     f"{predicted.step_bytes / peak:6.2f}")
    return "\n".join(lines)


# -- measured ------------------------------------------------------------------------------------


def test_parameter_count_matches_transformers(measured: dict[str, Any]) -> None:
    for run, result in zip(RUNS, measured["runs"]):
        shape = model_shape(measured["dirs"][run.model])
        assert shape.parameters() == result["num_parameters"], run.label
        trainable = shape.lora_parameters(run.lora_rank) if run.training_type == "lora" else shape.parameters()
        assert trainable == result["trainable_parameters"], run.label
        assert run.predict(shape).trainable_parameters == trainable
    for config, counted in zip(COUNTED_CONFIGS, measured["shapes"]):
        assert ModelShape.from_config(config).parameters() == counted["num_parameters"], config


def test_prediction_within_band_of_measured_peak(measured: dict[str, Any]) -> None:
    rows = []
    for run, result in zip(RUNS, measured["runs"]):
        rows.append((run, run.predict(model_shape(measured["dirs"][run.model])), result["peak_bytes"]))
    table = _table(rows)
    print(f"\n{table}\n(worker {measured['wall_s']:.1f} s, of which imports {measured['import_s']:.1f} s)")
    low, high = BAND
    for run, predicted, peak in rows:
        assert low <= predicted.step_bytes / peak <= high, f"{run.label} outside {BAND}:\n{table}"


def test_bigger_micro_batch_longer_sequence_and_full_fine_tune_take_more(measured: dict[str, Any]) -> None:
    peaks = {run: result["peak_bytes"] for run, result in zip(RUNS, measured["runs"])}
    for larger, smaller in ORDERINGS:
        shape = model_shape(measured["dirs"][larger.model])
        assert peaks[larger] > peaks[smaller], f"measured: {larger.label} vs {smaller.label}"
        assert larger.predict(shape).step_bytes > smaller.predict(shape).step_bytes, \
            f"predicted: {larger.label} vs {smaller.label}"


# -- pure ---------------------------------------------------------------------------------------


def test_known_parameter_counts() -> None:
    assert ModelShape.from_config(LLAMA2_7B).parameters() == 6_738_415_616
    assert ModelShape.from_config(LLAMA2_70B).parameters() == 68_976_648_192
    assert ModelShape.from_config(LLAMA3_8B).parameters() == 8_030_261_248
    # defaults: kv heads = heads, untied, head_dim = hidden / heads; a multimodal wrapper's text_config
    bare = {k: v for k, v in LLAMA2_7B.items() if k not in ("num_key_value_heads", "tie_word_embeddings")}
    assert ModelShape.from_config(bare) == ModelShape.from_config(LLAMA2_7B)
    assert ModelShape.from_config({"text_config": LLAMA2_7B}).parameters() == 6_738_415_616
    with pytest.raises(ValueError, match="hidden_size"):
        ModelShape.from_config({"vocab_size": 10})


# Tiny configs of other families: the shape read from config.json alone counts the parameters
# transformers builds, biases, norms, fused projections, learned positions and experts included.
FAMILY_CONFIGS: dict[str, dict[str, Any]] = {
    "llama": {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": 256},
    "mistral": {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "vocab_size": 256},
    "qwen2": {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": 256},
    "qwen3": {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 24, "vocab_size": 256},
    "gemma2": {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
               "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256},
    "gemma3_text": {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
                    "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256},
    "phi3": {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 4, "vocab_size": 256, "pad_token_id": 0},
    "gpt2": {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 128, "vocab_size": 256},
    "gpt_neox": {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
                 "vocab_size": 256},
    "mixtral": {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2, "vocab_size": 256},
    "qwen3_moe": {"hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32, "num_hidden_layers": 2,
                  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "num_experts": 8,
                  "num_experts_per_tok": 2, "vocab_size": 256},
}


@pytest.mark.parametrize("model_type", sorted(FAMILY_CONFIGS))
def test_parameter_counts_of_other_families_match_transformers(model_type: str) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    from tuneforge.train.model import linear_module_names

    config = AutoConfig.for_model(model_type, **FAMILY_CONFIGS[model_type])
    model = AutoModelForCausalLM.from_config(config)
    shape = ModelShape.from_config(config.to_dict())
    assert shape.parameters() == model.num_parameters()
    # the adapter 'all-linear' makes: every linear layer but the head; experts are tensors, not linears
    adapter = get_peft_model(model, LoraConfig(r=4, target_modules=linear_module_names(model)))
    assert shape.lora_parameters(4) == adapter.get_nb_trainable_parameters()[0]


def test_mixture_of_experts_weights_count_every_expert_and_activations_the_chosen_ones() -> None:
    base = {**FAMILY_CONFIGS["qwen3_moe"], "model_type": "qwen3_moe", "hidden_size": 512,
            "moe_intermediate_size": 256, "vocab_size": 1024}
    two = ModelShape.from_config(base)
    assert (two.num_experts, two.experts_per_token, two.moe_layers) == (8, 2, 2)
    more_experts = ModelShape.from_config({**base, "num_experts": 16})
    more_chosen = ModelShape.from_config({**base, "num_experts_per_tok": 4})
    run = {"training_type": "full", "micro_batch_size": 1, "seq_len": 512}
    e2, e16, k4 = (estimate(shape, **run) for shape in (two, more_experts, more_chosen))
    # experts are stored, not run: only the router's scores (fp32, one per expert) grow with them
    assert e16.weights > e2.weights and e16.activations - e2.activations == 512 * 2 * 4 * (16 - 8)
    assert k4.weights == e2.weights and k4.activations > e2.activations  # more run per token
    # first_k_dense_replace: the first layers are dense MLPs
    mixed = ModelShape.from_config({**base, "first_k_dense_replace": 1})
    assert (mixed.moe_layers, mixed.dense_layers) == (1, 1) and mixed.parameters() < two.parameters()


def test_lora_targets_by_other_families_names() -> None:
    gpt2 = ModelShape.from_config({**FAMILY_CONFIGS["gpt2"], "model_type": "gpt2"})
    assert gpt2.lora_parameters(4, ["c_attn"]) == 2 * 4 * (64 + 3 * 64)
    assert gpt2.lora_parameters(4, ["c_attn", "c_proj", "c_fc"]) == gpt2.lora_parameters(4)
    phi3 = ModelShape.from_config({**FAMILY_CONFIGS["phi3"], "model_type": "phi3"})
    assert phi3.lora_parameters(4, ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]) == phi3.lora_parameters(4)
    with pytest.raises(ValueError, match="unknown LoRA target"):
        phi3.lora_parameters(4, ["attn.wq_x"])


def test_estimate_parts_follow_the_training_type() -> None:
    shape = ModelShape.from_config(LLAMA2_7B)
    lora = estimate(shape, training_type="lora", micro_batch_size=1, seq_len=2048)
    qlora = estimate(shape, training_type="qlora", micro_batch_size=1, seq_len=2048)
    full = estimate(shape, training_type="full", micro_batch_size=1, seq_len=2048)
    params = shape.parameters()
    # rank 16 on every linear of Llama 2 7B: what PEFT reports for it
    assert lora.trainable_parameters == qlora.trainable_parameters == shape.lora_parameters(16) == 39_976_960
    # LoRA: bf16 base + fp32 adapter; QLoRA: ~0.52 byte a quantized weight, fp32 embeddings
    assert lora.weights == params * 2 + lora.trainable_parameters * 4
    assert 0.25 * lora.weights < qlora.weights < 0.4 * lora.weights
    # full, mixed precision: bf16 weights and gradients, fp32 master weights and two moments
    assert full.gradients == params * 2
    assert full.optimizer == params * 12
    assert lora.optimizer == lora.trainable_parameters * 8 and lora.gradients == lora.trainable_parameters * 4
    # QLoRA checkpoints (as the trainer does): far fewer activations than LoRA
    assert qlora.activations < lora.activations / 5
    assert estimate(shape, training_type="lora", micro_batch_size=1, seq_len=2048,
                    gradient_checkpointing=True).activations == pytest.approx(qlora.activations, rel=0.05)
    # the logits: three fp32 buffers of batch x seq x vocab
    assert lora.logits == 12 * 2048 * 32000
    # the dense score matrix of eager attention costs more than sdpa's mask; flash has neither
    eager, sdpa, flash = (estimate(shape, training_type="lora", micro_batch_size=2, seq_len=4096,
                                   attention=kind).activations for kind in ("eager", "sdpa", "flash"))
    assert eager > sdpa > flash
    for memory in (lora, qlora, full):
        assert memory.total_bytes == (memory.weights + memory.gradients + memory.optimizer + memory.overhead + max(
            memory.activations + max(memory.logits, memory.backward), memory.optimizer_step))
    # a full fine-tune of 7B on one GPU peaks in the optimizer step (the moments' scratch)
    assert full.optimizer_step > full.activations + full.logits
    with pytest.raises(ValueError):
        estimate(shape, training_type="dora", micro_batch_size=1, seq_len=10)
    with pytest.raises(ValueError, match="target"):
        estimate(shape, training_type="lora", micro_batch_size=1, seq_len=10, lora_targets=["attn.wq_x"])


def test_choose_micro_batch_fits_and_keeps_the_batch_size() -> None:
    shape = ModelShape.from_config(LLAMA2_7B)
    choice = choose_micro_batch(shape, training_type="lora", seq_len=2048, memory_bytes=GB80, batch_size=16)
    micro, accumulation = choice
    assert choice.fits and micro * accumulation == 16 and micro >= 1
    assert choice.estimate.total_bytes <= 0.9 * GB80
    # the next divisor up would not have fitted
    bigger = estimate(shape, training_type="lora", micro_batch_size=micro * 2, seq_len=2048)
    assert bigger.total_bytes > 0.9 * GB80
    # more memory, shorter rows or QLoRA never give a smaller micro-batch
    assert choose_micro_batch(shape, training_type="lora", seq_len=512, memory_bytes=GB80, batch_size=16)[0] >= micro
    assert choose_micro_batch(shape, training_type="qlora", seq_len=2048, memory_bytes=GB80,
                              batch_size=16)[0] >= micro
    # everything fits: one micro-batch per step
    assert tuple(choose_micro_batch(shape, training_type="qlora", seq_len=128, memory_bytes=GB80,
                                    batch_size=8)) == (8, 1)
    assert tuple(choose_micro_batch(shape, training_type="qlora", seq_len=128, memory_bytes=GB80, batch_size=8,
                                    max_micro_batch=4)) == (4, 2)
    # a batch size with few divisors: 12 -> 6, 4, 3, 2, 1; never a ragged micro-batch
    for batch_size in (12, 7, 1):
        micro, accumulation = choose_micro_batch(shape, training_type="lora", seq_len=2048, memory_bytes=GB80,
                                                 batch_size=batch_size)
        assert micro * accumulation == batch_size
    # nothing fits: (1, batch_size), and the caller can tell
    none = choose_micro_batch(shape, training_type="full", seq_len=2048, memory_bytes=24 * GIB, batch_size=8)
    assert tuple(none) == (1, 8) and not none.fits
    assert none.micro_batch_size == 1 and none.gradient_accumulation_steps == 8


def test_gpus_needed_for_7b_and_70b() -> None:
    seven, seventy = ModelShape.from_config(LLAMA2_7B), ModelShape.from_config(LLAMA2_70B)
    assert gpus_needed(seven, training_type="lora", seq_len=2048, gpu_memory_bytes=GB80) == 1
    assert gpus_needed(seven, training_type="qlora", seq_len=2048, gpu_memory_bytes=24 * GIB) == 1
    assert gpus_needed(seven, training_type="full", seq_len=2048, gpu_memory_bytes=GB80) == 2
    assert gpus_needed(seventy, training_type="qlora", seq_len=2048, gpu_memory_bytes=GB80) == 1
    # 70B full: 16 bytes a parameter (~1 TiB) sharded, activations checkpointed
    full_70b = gpus_needed(seventy, training_type="full", seq_len=2048, gpu_memory_bytes=GB80,
                           gradient_checkpointing=True)
    assert full_70b >= 16 and full_70b & (full_70b - 1) == 0
    # without checkpointing a 2048-token sequence's activations alone nearly fill a GPU
    with pytest.raises(DoesNotFit, match="checkpointing"):
        gpus_needed(seventy, training_type="full", seq_len=2048, gpu_memory_bytes=GB80, max_gpus=256)
    # LoRA on 70B: bf16 weights (~128 GiB) must be sharded too
    assert gpus_needed(seventy, training_type="lora", seq_len=2048, gpu_memory_bytes=GB80,
                       gradient_checkpointing=True) in (2, 4)


# -- the worker: this file run as a script, never under pytest ------------------------------------


def _status() -> dict[str, int]:
    values = {}
    with open("/proc/self/status") as handle:
        for line in handle:
            key, _, rest = line.partition(":")
            if key in ("VmHWM", "VmRSS"):
                values[key] = int(rest.split()[0]) * 1024
    return values


def _in_child(task: Callable[[Any], dict], arg: Any) -> tuple[int, int]:
    """Run `task(arg)` in a forked child; returns (pid, read end of its result pipe)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(read)
        try:
            result = {"ok": True, **task(arg)}
        except BaseException:  # noqa: BLE001 - reported to the parent
            result = {"ok": False, "error": traceback.format_exc()}
        with os.fdopen(write, "w") as out:
            out.write(json.dumps(result))
        os._exit(0)
    os.close(write)
    return pid, read


def _collect(pid: int, read: int) -> dict[str, Any]:
    with os.fdopen(read) as handle:
        data = handle.read()
    os.waitpid(pid, 0)
    return json.loads(data) if data else {"ok": False, "error": f"child {pid} died without a result"}


def _run_all(task: Callable[[Any], dict], items: list, parallel: int) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = [{}] * len(items)
    pending, running = list(enumerate(items)), {}
    while pending or running:
        while pending and len(running) < parallel:
            index, item = pending.pop(0)
            running[index] = _in_child(task, item)
        index = next(iter(running))
        results[index] = _collect(*running.pop(index))
    return results


def _worker_main() -> None:
    job = json.load(sys.stdin)
    started = time.monotonic()
    import torch  # the heavy imports, once, before any fork

    torch.set_num_threads(1)
    import peft  # noqa: F401
    import transformers

    from tuneforge.data.tokenize import TokenizedExample
    from tuneforge.demo.tiny_model import build_tiny_model
    from tuneforge.domain.spec import LoraConfig
    from tuneforge.train.batches import collate_packed, score_tokens
    from tuneforge.train.model import load_base_model, prepare_trainable, trainable_parameters
    from tuneforge.train.setup import configure_threads

    import_s = time.monotonic() - started
    cpu = torch.device("cpu")

    def build(item: tuple[str, dict]) -> dict:
        name, model = item
        build_tiny_model(Path(model["dir"]), **model["kwargs"])
        return {"model": name}

    def count(config: dict) -> dict:
        config = dict(config)
        hf_config = transformers.AutoConfig.for_model(config.pop("model_type"), **config)
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(hf_config)
        return {"num_parameters": model.num_parameters()}

    def load(run: dict) -> tuple[Any, Any]:
        model_dir = Path(job["models"][run["model"]]["dir"])
        if run["dtype"] == "float32":
            return load_base_model(model_dir, cpu)  # what the trainer does on a CPU
        model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, run["dtype"]))
        return model, transformers.AutoTokenizer.from_pretrained(model_dir)

    def train(run: dict) -> dict:
        torch.manual_seed(0)
        model, tokenizer = load(run)
        num_parameters = model.num_parameters()
        configure_threads(cpu, num_parameters)  # one thread below 20M parameters, as the trainer
        if run["attention"] != "sdpa":
            model.set_attn_implementation(run["attention"])
        if run["gradient_checkpointing"]:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        lora = LoraConfig(rank=run["lora_rank"], alpha=2 * run["lora_rank"])
        model = prepare_trainable(model, run["training_type"], lora, seed=0)
        params = trainable_parameters(model)
        optimizer = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0)
        model.train()
        # packed rows of seq_len tokens, two examples each (the block-diagonal mask of packing)
        rows_per_batch, length = run["micro_batch_size"], run["seq_len"]
        generator = torch.Generator().manual_seed(0)
        batches = []
        for _ in range(job["steps"] * job["accumulation"]):
            rows = []
            for _ in range(rows_per_batch):
                ids = torch.randint(4, model.config.vocab_size, (length,), generator=generator).tolist()
                half = length // 2
                rows.append([TokenizedExample(ids[:half], ids[:half]), TokenizedExample(ids[half:], ids[half:])])
            batches.append(collate_packed(rows, tokenizer.pad_token_id, cpu))
        with torch.no_grad():  # page the memory-mapped weights in before the baseline
            for param in model.parameters():
                param.sum()
        try:
            with open("/proc/self/clear_refs", "w") as handle:
                handle.write("5")  # reset VmHWM to the current RSS
        except OSError:
            pass  # reported through hwm_reset; the test skips
        baseline = _status()
        step_started = time.monotonic()
        feed = iter(batches)
        for _ in range(job["steps"]):
            for _ in range(job["accumulation"]):
                scores = score_tokens(model, next(feed))
                (scores.loss_sum / (rows_per_batch * length)).backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        end = _status()
        return {
            "peak_bytes": end["VmHWM"] - baseline["VmRSS"],
            "baseline_rss": baseline["VmRSS"],
            "hwm_reset": baseline["VmHWM"] == baseline["VmRSS"],
            "num_parameters": num_parameters,
            "trainable_parameters": sum(param.numel() for param in params),
            "train_s": time.monotonic() - step_started,
        }

    parallel = int(job["parallel"])
    builds = _run_all(build, list(job["models"].items()), parallel) if job["build"] else []
    built_s = time.monotonic() - started
    shapes = _run_all(count, job["shapes"], parallel)
    runs = _run_all(train, job["runs"], parallel)
    print(RESULT_PREFIX + json.dumps({
        "import_s": import_s, "build_s": built_s - import_s, "builds": builds, "shapes": shapes, "runs": runs,
    }), flush=True)


if __name__ == "__main__":
    _worker_main()
