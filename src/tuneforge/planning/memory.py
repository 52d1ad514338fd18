"""Peak training memory of a fine-tuning job, predicted from the model's config.

Pure Python (no torch), for the control plane: to size a job's GPU request
(`gpus_needed`) and to pick the "auto" micro-batch (`choose_micro_batch`) long
before any trainer runs (`services/training/planning.py`; docs/memory.md). The model of
memory is written out in `estimate` and in docs/memory.md, which also compares
it with peak memory measured on a CPU (tests/unit/train/test_memory_estimate.py). The model's
sizes come from `planning/model_shape.py`.

Scope: decoder-only transformers as their config.json describes them — dense or
mixture-of-experts, gated MLP (Llama, Mistral, Qwen, Gemma, Phi-3) or not
(GPT-2, GPT-NeoX), fused projections or not — trained the way tuneforge's trainer
trains them: PEFT LoRA on a frozen base, LoRA on a 4-bit NF4 base (QLoRA), or
every weight; micro-batches of `micro_batch_size` rows of at most `seq_len`
tokens (packed rows fill `seq_len`; right-padded rows are at most that long);
next-token cross-entropy on fp32 logits.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

# ModelShape stays importable from here: the planner and the docs call it memory.ModelShape
from tuneforge.domain.vocab import TRAINING_TYPES
from tuneforge.planning.model_shape import ATTENTION_ROLES, ModelShape, lora_target_names

GIB = 1024 ** 3
MIB = 1024 ** 2

OPTIMIZERS = ("adamw", "adamw_pure", "adamw_8bit", "sgd")
ATTENTION = ("sdpa", "eager", "flash")
DEVICES = ("cuda", "cpu")

# NF4 with double quantization: 4 bits a weight, one 8-bit absmax per 64-weight block and one
# fp32 scale per 256 such blocks (bitsandbytes' defaults, what the trainer asks for).
NF4_BYTES_PER_PARAM = 0.5 + 1 / 64 + 4 / (64 * 256)

# What a process needs besides its tensors. CUDA: the context, cuBLAS/cuDNN workspaces and
# NCCL buffers — about 0.5-1 GiB on current GPUs (assumed, not measured here: no GPU).
# CPU: autograd engine, oneDNN scratch space, allocator slack of small tensors; measured on
# the test machine (docs/memory.md) as the peak of a run whose tensors are all negligible.
RUNTIME_OVERHEAD_BYTES = {"cuda": 1 * GIB, "cpu": 14 * MIB}

# Bytes of the fp32 buffers alive at the loss, per logit (see `estimate`).
LOSS_BYTES_PER_LOGIT = 12


class DoesNotFit(ValueError):
    """The job cannot fit however many GPUs (or however small a micro-batch) it gets."""


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes, by part. `total_bytes` is the predicted peak of one process (one GPU)."""

    weights: int  # the model as loaded (base + adapter), resident before the first step
    gradients: int  # of the trainable parameters
    optimizer: int  # optimizer states (+ fp32 master weights in mixed precision)
    activations: int  # saved for backward by the micro-batch, all layers
    logits: int  # fp32 buffers at the loss
    backward: int  # a layer's backward: gradients in flight (+ its recomputed activations)
    optimizer_step: int  # transient scratch of the optimizer step (when activations are gone)
    overhead: int  # runtime: CUDA context or CPU runtime, QLoRA dequantization, FSDP gathers
    parameters: int  # of the base model
    trainable_parameters: int
    rollout: int = 0  # sampling before the step (reinforcement): key/value cache, last logits, one layer's work,
    # and a LoRA model's merged copy of its adapted weights


    @property
    def total_bytes(self) -> int:
        """Weights, gradients, optimizer states and overhead are resident throughout. On top of
        them: the saved activations plus either the loss buffers (at the loss) or a layer's
        backward (after the loss buffers are freed); or else the optimizer step's scratch —
        whichever is largest (activations are gone by the optimizer step)."""
        return (self.weights + self.gradients + self.optimizer + self.overhead
                + max(self.activations + max(self.logits, self.backward), self.optimizer_step, self.rollout))

    @property
    def step_bytes(self) -> int:
        """The peak above the loaded model: what a training step adds to the process."""
        return self.total_bytes - self.weights

    def as_dict(self) -> dict[str, int]:
        return {**asdict(self), "total_bytes": self.total_bytes}


def _check_choice(name: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")


def estimate(
    shape: ModelShape,
    *,
    training_type: str,
    micro_batch_size: int,
    seq_len: int,
    lora_rank: int = 16,
    lora_targets: str | Sequence[str] = "all-linear",
    lora_dropout: float = 0.0,
    weight_bytes: int = 2,
    optimizer: str = "adamw",
    gradient_checkpointing: bool | None = None,
    attention: str = "sdpa",
    device: str = "cuda",
    shards: int = 1,
    rollout_sequences: int = 0,
    rollout_tokens: int = 0,
) -> MemoryEstimate:
    """Predicted peak memory of one training process, by part. `rollout_sequences` sequences of
    `rollout_tokens` (prompt + completion) sampled at once before each step: `rollout_bytes`.

    Notation: P base parameters, N trainable parameters (P for a full fine-tune,
    the adapter's r·Σ(in+out) for LoRA), a = `weight_bytes` (bytes of the
    compute dtype: 2 for bf16 on a GPU, 4 for fp32 on a CPU; for QLoRA the
    dtype the 4-bit weights are dequantized to), B =
    `micro_batch_size`, S = `seq_len`, T = B·S tokens, L layers, h hidden size,
    i intermediate size, q = heads·head_dim, kv = kv_heads·head_dim, H heads,
    V vocabulary, r LoRA rank, n adapted linears per layer.

    weights      lora/full: P·a; + N·4 for a LoRA adapter (PEFT keeps adapter weights
                 in fp32 even on a bf16 base). qlora: the linears of every layer in
                 NF4, ~0.516 byte each (4 bits + absmax constants), embeddings, head
                 and norms in fp32 (prepare_model_for_kbit_training casts them), + N·4.
    gradients    lora/qlora: N·4. full: P·a (gradients take the parameters' dtype).
    optimizer    adamw: two fp32 moments, N·8, and for a full fine-tune in mixed
                 precision (a < 4) also fp32 master weights, P·4 — 16 bytes a
                 parameter in all for a full bf16 fine-tune. adamw_pure: the moments
                 in the parameters' dtype and no master copy (torch.optim.AdamW on
                 bf16 parameters, what tuneforge's trainer does today on a GPU).
                 adamw_8bit: N·2 (+ master weights). sgd: nothing.
    activations  what autograd keeps for the backward pass, per layer and token:
                   norms      2·4h: each RMSNorm keeps its input in fp32; full: + 2·a·h,
                              the normalized product (the norm weights train)
                   attention  a·(2q + 2kv'): rotated queries, keys, values and the
                              output; kv' = q when keys/values are repeated to every
                              head (sdpa with a mask, eager), kv for flash-attention
                   mask       sdpa: a·S (the dense mask as a float bias, B·S·S·a a
                              layer); eager: 4·H·S (+ a·H·S if a < 4), the softmax of
                              the B·H·S·S score matrix; flash: nothing
                   mlp        3·a·i: gate, its SiLU and up
                   inputs     the inputs of the linears whose weight trains or that
                              carry an adapter: the attention norm's output a·h (q, k,
                              v), the MLP norm's output a·h (gate, up) and the MLP
                              product a·i (down), each kept once — but when a < 4
                              PEFT casts the input of every adapter to fp32, so each
                              adapted linear keeps its own copy, 4·in_features
                   lora       4·n·r, the adapters' r-wide intermediates; with LoRA
                              dropout + (4 + 1)·Σin (a + 1 when a = 4): the
                              dropped-out input of each adapter and its mask
                 times T·L; plus the final norm (4h + a·h, + a·h full), the rotary
                 tables (2·a·head_dim) per token and the boolean mask B·S·S.
                 With gradient checkpointing (always on for QLoRA in the trainer)
                 only each layer's input, a·h per token, is kept (and the final
                 norm's, the tables and the mask).
                 (fp32 LoRA on all linears: 16h + 4(2q + 2kv') + 4S + 16i + 28r
                 bytes a token a layer.)
    logits       12·T·V: at the loss three fp32 B·S·V buffers are alive — in the
                 forward the logits, their fp32 (or flattened) copy and the
                 log-softmax kept for backward; in the backward the log-softmax,
                 its gradient and the logits' gradient. Often the peak of a small
                 model with a large vocabulary.
    backward     T·(3·a·i + 2·a·h): the gradients in flight through one layer's
                 backward (three i-wide in the MLP, two h-wide); with gradient
                 checkpointing + the layer's full activations (above), recomputed
                 just before. Alive only once the loss buffers are freed, so the
                 micro-batch costs activations + max(logits, backward).
    optimizer_step  transient scratch of the step: on cuda torch's multi-tensor
                 AdamW makes one temporary the size of a moment for every
                 trainable parameter (N·4); on cpu the per-tensor AdamW needs two
                 of the largest parameter only. Activations are freed by then.
    overhead     a fixed runtime cost (`RUNTIME_OVERHEAD_BYTES`: ~1 GiB of CUDA
                 context and workspaces on a GPU; 14 MiB on a CPU, measured); qlora:
                 + one linear weight dequantized to the compute dtype; sharded
                 (shards > 1): + two layers' parameters gathered whole (FSDP's
                 all-gather of the running layer and its prefetch).

    The sum assumes gradients of an earlier micro-batch are alive during the next
    forward pass (gradient accumulation > 1). With a single micro-batch per step
    it overstates the peak by up to `gradients` (a full fine-tune's P·a).

    `shards` > 1 divides weights, gradients, optimizer states and the optimizer
    step's scratch among that many GPUs, as FSDP (ZeRO-3) does; activations and
    logits are per GPU and do not shrink. `gradient_checkpointing=None` follows
    the trainer: on for QLoRA, off otherwise.
    """
    _check_choice("training_type", training_type, TRAINING_TYPES)
    _check_choice("optimizer", optimizer, OPTIMIZERS)
    _check_choice("attention", attention, ATTENTION)
    _check_choice("device", device, DEVICES)
    if micro_batch_size < 1 or seq_len < 1 or shards < 1:
        raise ValueError("micro_batch_size, seq_len and shards must be at least 1")
    if gradient_checkpointing is None:
        gradient_checkpointing = training_type == "qlora"

    a, h = weight_bytes, shape.hidden_size
    B, S = micro_batch_size, seq_len
    T = B * S
    P = shape.parameters()
    full = training_type == "full"
    targets = lora_target_names(lora_targets, shape) if not full else []
    N = P if full else shape.lora_parameters(lora_rank, targets)

    # experts are one tensor per kind and layer (all experts' gate+up, all experts' down)
    expert_stack = shape.num_experts * (len(shape.mlp_roles) - 1) * shape.expert_intermediate_size * h

    weights, gradients, optimizer_bytes, step_scratch = _resident_state(
        shape, training_type=training_type, weight_bytes=a, trainable=N, optimizer=optimizer, device=device,
        targets=targets, lora_rank=lora_rank, expert_stack=expert_stack)

    activations, backward = _activations(
        shape, training_type=training_type, weight_bytes=a, targets=targets, micro_batch_size=B, seq_len=S,
        attention=attention, lora_rank=lora_rank, lora_dropout=lora_dropout,
        gradient_checkpointing=gradient_checkpointing)
    logits = LOSS_BYTES_PER_LOGIT * T * shape.vocab_size

    # -- runtime ---------------------------------------------------------------------------
    overhead = RUNTIME_OVERHEAD_BYTES[device]
    if training_type == "qlora":
        overhead += max(shape.largest_linear(), expert_stack) * a
    if shards > 1:
        largest_layer = shape.layer_parameters(moe=shape.moe_layers > 0)
        per_layer_weights = largest_layer * (NF4_BYTES_PER_PARAM if training_type == "qlora" else a)
        overhead += 2 * int(per_layer_weights)
        weights, gradients = weights / shards, gradients / shards
        optimizer_bytes, step_scratch = optimizer_bytes / shards, step_scratch / shards

    return MemoryEstimate(
        weights=math.ceil(weights), gradients=math.ceil(gradients), optimizer=math.ceil(optimizer_bytes),
        activations=math.ceil(activations), logits=math.ceil(logits), backward=math.ceil(backward),
        optimizer_step=math.ceil(step_scratch), overhead=math.ceil(overhead),
        parameters=P, trainable_parameters=N,
        rollout=rollout_bytes(shape, rollout_sequences, rollout_tokens, weight_bytes=a)
        + merged_adapter_bytes(shape, training_type=training_type, weight_bytes=a, shards=shards,
                               sampling=rollout_sequences > 0),
    )


def _activations(shape: ModelShape, *, training_type: str, weight_bytes: int, targets: list[str],
                 micro_batch_size: int, seq_len: int, attention: str, lora_rank: int, lora_dropout: float,
                 gradient_checkpointing: bool) -> tuple[float, float]:
    """(activations, backward) of `estimate` (the rules in its docstring)."""
    a, full = weight_bytes, training_type == "full"
    adapter, mixed = not full, a < 4
    h, i, L = shape.hidden_size, shape.intermediate_size, shape.num_hidden_layers
    H, head_dim = shape.num_attention_heads, shape.dim_per_head
    q, kv = shape.q_dim, shape.kv_dim
    B, S = micro_batch_size, seq_len
    T = B * S

    kv_saved = kv if attention == "flash" else q  # a mask makes sdpa repeat keys/values to every head
    # fp32 inputs of the layer's norms; the normalized products when the norms train
    norms = shape.norms_per_layer * (4 * h + (a * h if full else 0))
    attn = a * (2 * q + 2 * kv_saved)  # rotated q, k', v', attention output
    if attention == "sdpa":
        attn += a * S
    elif attention == "eager":
        attn += 4 * H * S + (a * H * S if mixed else 0)
    mlp_factor = len(shape.mlp_roles)  # gated: gate, its activation, up; else: up, its activation

    def layer_bytes(mlps: list[tuple[int, int, bool]]) -> int:
        """Per token, a decoder layer whose MLP part is `mlps`: (width, copies of each token, whether
        LoRA adapts its linears), e.g. a dense MLP [(i, 1, True)], a mixture of
        experts [(expert width, experts per token, False), (shared width, 1, True)]."""
        mlp = sum(mlp_factor * a * width * copies for width, copies, _ in mlps)
        # Inputs of the linear layers, kept when the layer's weight trains or it carries an adapter:
        # once (shared) in the compute dtype, or one fp32 copy per adapter when PEFT casts them.
        # The attention output is kept by the attention itself already (counted above).
        inputs = 0
        consumers = [(h, 1, ("q_proj", "k_proj", "v_proj"), True), (q, 0, ("o_proj",), True)]
        for width, copies, trainable in mlps:
            consumers += [(h, copies, ("gate_proj", "up_proj"), trainable), (width, copies, ("down_proj",), trainable)]
        for size, copies, names, trainable in consumers:
            adapted = [name for name in names if name in targets and trainable]
            if full or (adapted and not mixed):
                inputs += a * size * copies
            elif adapted:  # one copy per adapter (a fused projection's roles share one)
                inputs += 4 * size * copies * len(shape.adapters(adapted))
        lora = 0
        if adapter:
            adapters = shape.adapters([name for name in targets
                                       if name in ATTENTION_ROLES or any(trainable for _, _, trainable in mlps)])
            lora = 4 * len(adapters) * lora_rank  # each adapter's r-wide intermediate
            if lora_dropout > 0:  # a dropped-out copy of the input and its mask, per adapter
                lora += ((4 if mixed else a) + 1) * sum(fan_in for fan_in, _ in adapters)
        return norms + attn + mlp + inputs + lora

    dense_layer = layer_bytes([(i, 1, True)])
    moe_mlps = [(shape.expert_intermediate_size, shape.experts_per_token, False)]
    if shape.shared_intermediate_size:
        moe_mlps.append((shape.shared_intermediate_size, 1, True))
    moe_layer = layer_bytes(moe_mlps) + 4 * shape.num_experts if shape.moe_layers else 0  # + fp32 router scores
    per_layer = max(dense_layer if shape.dense_layers else 0, moe_layer)
    # the widest MLP a token goes through (for the gradients in flight in a layer's backward)
    mlp_width = max(i if shape.dense_layers else 0,
                    sum(width * copies for width, copies, _ in moe_mlps) if shape.moe_layers else 0)
    # final norm (its fp32 input, its output for the head) and the rotary cos/sin tables
    model_level = 4 * h + a * h + (a * h if full else 0) + 2 * a * head_dim
    mask_bytes = 0 if attention == "flash" else B * S * S
    if gradient_checkpointing:
        activations = T * (L * a * h + model_level) + mask_bytes
    else:
        activations = T * (shape.dense_layers * dense_layer + shape.moe_layers * moe_layer + model_level) + mask_bytes
    # gradients in flight through a layer's backward (the MLP's three i-wide ones, two for a plain
    # MLP, and two h-wide), and with checkpointing the layer's activations, recomputed just before
    backward = T * ((mlp_factor * a * mlp_width + 2 * a * h) + (per_layer if gradient_checkpointing else 0))

    return activations, backward


def merged_adapter_bytes(shape: ModelShape, *, training_type: str, weight_bytes: int, shards: int,
                         sampling: bool) -> int:
    """The copy of the adapted weights a LoRA model samples through (train/sampling.py's
    `merged_adapter`): the linear layers' weights, when they fit `MERGED_ADAPTER_BYTES` and are not
    sharded; 0 otherwise (the model samples through its adapters)."""
    if not sampling or training_type != "lora" or shards > 1:
        return 0
    copied = shape.linear_parameters() * weight_bytes
    return copied if copied <= MERGED_ADAPTER_BYTES else 0


MERGED_ADAPTER_BYTES = 2 << 30  # the most a LoRA model's merged copy for sampling may take


def rollout_bytes(shape: ModelShape, sequences: int, tokens: int, *, weight_bytes: int) -> int:
    """What sampling `sequences` sequences of up to `tokens` tokens at once holds beside the model
    (no gradients): the key/value cache of every layer, the last position's logits and their
    probabilities in fp32, and the prefill's transient work in one layer (its MLP at the widest)."""
    if sequences <= 0 or tokens <= 0:
        return 0
    cache = sequences * tokens * shape.num_hidden_layers * 2 * shape.kv_dim * weight_bytes
    last_logits = sequences * shape.vocab_size * (weight_bytes + 2 * 4)
    prefill_layer = sequences * tokens * (2 * shape.intermediate_size + 2 * shape.hidden_size) * weight_bytes
    return cache + last_logits + prefill_layer


def _resident_state(shape: ModelShape, *, training_type: str, weight_bytes: int, trainable: int, optimizer: str,
                    device: str, targets: list[str], lora_rank: int,
                    expert_stack: int) -> tuple[float, float, float, float]:
    """Weights, gradients, optimizer states and the optimizer step's scratch of one unsharded process
    (the rules in `estimate`'s docstring)."""
    a, N, P = weight_bytes, trainable, shape.parameters()
    full = training_type == "full"
    if training_type == "qlora":
        quantized = shape.linear_parameters()
        weights = quantized * NF4_BYTES_PER_PARAM + (P - quantized) * 4 + N * 4
    elif training_type == "lora":
        weights = P * a + N * 4
    else:
        weights = P * a
    gradients = N * (a if full else 4)
    param_bytes = a if full else 4  # the trainable parameters' dtype
    master = P * 4 if (full and a < 4 and optimizer in ("adamw", "adamw_8bit")) else 0
    optimizer_bytes = {
        "adamw": N * 8 + master,
        "adamw_pure": N * 2 * param_bytes,
        "adamw_8bit": N * 2 + master,
        "sgd": 0,
    }[optimizer]
    if optimizer == "sgd":
        step_scratch = 0
    elif device == "cuda":
        step_scratch = N * (4 if optimizer != "adamw_pure" else param_bytes)
    else:
        largest = max(shape.largest_linear(), shape.hidden_size * shape.vocab_size, expert_stack)
        if not full:  # the largest LoRA matrix, r x in or out x r
            largest = max(max(adapter) for adapter in shape.adapters(targets)) * lora_rank
        step_scratch = 2 * largest * param_bytes  # sqrt of the second moment, then its scaled copy
    return weights, gradients, optimizer_bytes, step_scratch


class MicroBatchChoice(tuple):
    """`(micro_batch_size, gradient_accumulation_steps)`, unpackable like a pair, with
    `fits` (False when even a micro-batch of 1 exceeds the budget) and the `estimate`
    of the chosen micro-batch."""

    fits: bool
    estimate: MemoryEstimate

    def __new__(cls, micro_batch_size: int, accumulation_steps: int, fits: bool,
                memory: MemoryEstimate) -> MicroBatchChoice:
        choice = super().__new__(cls, (micro_batch_size, accumulation_steps))
        choice.fits = fits
        choice.estimate = memory
        return choice

    @property
    def micro_batch_size(self) -> int:
        return self[0]

    @property
    def gradient_accumulation_steps(self) -> int:
        return self[1]


def choose_micro_batch(
    shape: ModelShape,
    *,
    training_type: str,
    seq_len: int,
    memory_bytes: int,
    batch_size: int,
    headroom: float = 0.9,
    max_micro_batch: int | None = None,
    **kw,
) -> MicroBatchChoice:
    """The largest micro-batch whose estimate fits in `headroom`·`memory_bytes`, and the
    gradient accumulation steps that make up `batch_size`: micro × accumulation ==
    batch_size always.

    Candidates are the divisors of `batch_size` (at most `max_micro_batch`), so the
    effective batch the tenant asked for is kept exactly and no micro-batch is ragged.
    For the power-of-two batch sizes "auto" picks every power of two below is a
    candidate, so nothing is lost; an awkward batch size (a prime, say 7) only has 7
    and 1, and gets 1 × 7 when 7 does not fit — slower, never a different batch.

    When even a micro-batch of 1 does not fit, the answer is (1, batch_size) with
    `fits` False: the caller should ask for more memory (more GPUs, `gpus_needed`),
    shorter sequences or gradient checkpointing rather than start a job bound to run
    out of memory. `kw` goes to `estimate` (lora_rank, weight_bytes, ...).
    """
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    budget = headroom * memory_bytes
    limit = min(batch_size, max_micro_batch or batch_size)
    divisors = [m for m in range(limit, 0, -1) if batch_size % m == 0]
    for micro in divisors:
        memory = estimate(shape, training_type=training_type, micro_batch_size=micro, seq_len=seq_len, **kw)
        if memory.total_bytes <= budget:
            return MicroBatchChoice(micro, batch_size // micro, True, memory)
    return MicroBatchChoice(1, batch_size, False, memory)


def gpus_needed(
    shape: ModelShape,
    *,
    training_type: str,
    seq_len: int,
    gpu_memory_bytes: int,
    headroom: float = 0.9,
    max_gpus: int = 1024,
    **kw,
) -> int:
    """The smallest power of two of GPUs on which the job fits at micro-batch 1.

    One GPU holds the whole estimate. Several shard the model as FSDP (ZeRO-3) does:
    weights, gradients and optimizer states (and the optimizer step's scratch) split
    evenly, activations and loss buffers of a micro-batch of 1 on every GPU, plus two
    layers gathered whole. Sharding applies to every training type — it is the only
    way a base model larger than one GPU can be trained with LoRA too.

    Raises `DoesNotFit` when `max_gpus` are not enough, e.g. when one sequence's
    activations alone exceed a GPU (more GPUs do not shrink them; gradient
    checkpointing or a shorter `seq_len` does). `kw` goes to `estimate`.
    """
    budget = headroom * gpu_memory_bytes
    gpus = 1
    while gpus <= max_gpus:
        memory = estimate(shape, training_type=training_type, micro_batch_size=1, seq_len=seq_len,
                          shards=gpus, **kw)
        if memory.total_bytes <= budget:
            return gpus
        gpus *= 2
    per_gpu = memory.activations + memory.logits + memory.overhead
    hint = (f"; a sequence's activations alone take {per_gpu / GIB:.1f} GiB a GPU: gradient checkpointing "
            f"or a shorter seq_len would help, more GPUs would not") if per_gpu > budget / 2 else ""
    raise DoesNotFit(
        f"{training_type} training at seq_len {seq_len} needs more than {max_gpus} GPUs of "
        f"{gpu_memory_bytes / GIB:.0f} GiB (at {max_gpus}: {memory.total_bytes / GIB:.1f} GiB a GPU){hint}"
    )
