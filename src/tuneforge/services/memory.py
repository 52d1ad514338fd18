"""Peak training memory of a fine-tuning job, predicted from the model's config.

Pure Python (no torch), for the control plane: to size a job's GPU request
(`gpus_needed`) and to pick the "auto" micro-batch (`choose_micro_batch`) long
before any trainer runs (`services/planning.py`; docs/memory.md). The model of
memory is written out in `estimate` and in docs/memory.md, which also compares
it with peak memory measured on a CPU (tests/unit/train/test_memory_estimate.py).

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

GIB = 1024 ** 3
MIB = 1024 ** 2

TRAINING_TYPES = ("lora", "qlora", "full")
OPTIMIZERS = ("adamw", "adamw_pure", "adamw_8bit", "sgd")
ATTENTION = ("sdpa", "eager", "flash")
DEVICES = ("cuda", "cpu")

# Linear layers of one decoder layer, by the leaf names PEFT targets ("all-linear" = all of them).
LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

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


# What differs between decoder families beyond config.json's sizes, by `model_type`; a family not
# listed is taken as Llama-like (gated MLP, RMSNorm, biases only where the config says). Only what
# changes the counts is recorded: the MLP's form, the norms' form and number, biases, learned
# position embeddings and per-head q/k norms.
@dataclass(frozen=True)
class Family:
    gated_mlp: bool = True  # gate and up projections (SwiGLU/GeGLU) rather than up alone
    layer_norm: bool = False  # LayerNorm (weight and bias) rather than RMSNorm (weight)
    norms_per_layer: int = 2
    linear_bias: bool = False  # every linear layer of a decoder layer has a bias
    qkv_bias: bool = False  # q, k and v only (Qwen2)
    qk_norm: bool = False  # an RMSNorm over each head's queries and keys (Qwen3, Gemma 3)
    learned_positions: str | None = None  # config key of the position embedding table's length
    fused_qkv: bool = False  # one linear computes q, k and v (one adapter on it)
    fused_gate_up: bool = False  # one linear computes gate and up


FAMILIES: dict[str, Family] = {
    "gpt2": Family(gated_mlp=False, layer_norm=True, linear_bias=True, learned_positions="n_positions",
                   fused_qkv=True),
    "gpt_neox": Family(gated_mlp=False, layer_norm=True, linear_bias=True, fused_qkv=True),
    "phi3": Family(fused_qkv=True, fused_gate_up=True),
    "gptj": Family(gated_mlp=False, layer_norm=True, norms_per_layer=1),
    "phi": Family(gated_mlp=False, layer_norm=True, norms_per_layer=1, linear_bias=True),
    "qwen2": Family(qkv_bias=True),
    "qwen2_moe": Family(qkv_bias=True),
    "qwen3": Family(qk_norm=True),
    "qwen3_moe": Family(qk_norm=True),
    "gemma2": Family(norms_per_layer=4),
    "gemma3_text": Family(norms_per_layer=4, qk_norm=True),
    "gemma3": Family(norms_per_layer=4, qk_norm=True),
}

# config.json keys of other families, for the sizes this model reads (GPT-2's names)
_ALIASES = {"hidden_size": ("n_embd",), "num_hidden_layers": ("n_layer",), "num_attention_heads": ("n_head",),
            "intermediate_size": ("n_inner",)}
_EXPERT_COUNT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")


def _size(config: dict, key: str) -> int | None:
    for name in (key, *_ALIASES.get(key, ())):
        if config.get(name):
            return int(config[name])
    return None


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder-only transformer that memory depends on, read from its config:
    dense or mixture-of-experts, gated MLP or not, fused projections or not (a fused `qkv_proj`
    holds what q, k and v do; the names of the modules do not matter here)."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    tie_word_embeddings: bool = False
    head_dim: int | None = None  # hidden_size // num_attention_heads when the config has none
    attention_bias: bool = False  # biases on q, k, v and o (Llama's `attention_bias`)
    qkv_bias: bool = False  # biases on q, k and v only (Qwen2)
    mlp_bias: bool = False
    gated_mlp: bool = True
    layer_norm: bool = False  # LayerNorm (weight and bias) rather than RMSNorm
    norms_per_layer: int = 2
    qk_norm: bool = False
    position_embeddings: int = 0  # rows of a learned position embedding table (GPT-2)
    fused_qkv: bool = False
    fused_gate_up: bool = False
    # mixture of experts: `num_experts` MLPs of `expert_intermediate_size` in each of `moe_layers`
    # layers (the others dense), each token through `experts_per_token` of them, chosen by a
    # router (hidden x experts), plus a shared expert of `shared_intermediate_size` where one is
    num_experts: int = 0
    experts_per_token: int = 0
    expert_intermediate_size: int = 0
    shared_intermediate_size: int = 0
    moe_layers: int = 0

    @classmethod
    def from_config(cls, config: dict) -> ModelShape:
        """From a Hugging Face config.json (as a dict). A multimodal config's `text_config` is
        used when present. Raises ValueError when a size it needs is missing."""
        if isinstance(config.get("text_config"), dict):
            config = {**config["text_config"], **{k: v for k, v in config.items() if k == "tie_word_embeddings"}}
        model_type = str(config.get("model_type", ""))
        family = FAMILIES.get(model_type, Family())
        sizes = {key: _size(config, key) for key in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                                     "vocab_size")}
        missing = [key for key, value in sizes.items() if not value]
        if missing:
            raise ValueError(f"config.json lacks {', '.join(missing)}")
        hidden, heads, layers = sizes["hidden_size"], sizes["num_attention_heads"], sizes["num_hidden_layers"]
        experts = next((int(config[key]) for key in _EXPERT_COUNT_KEYS if config.get(key)), 0)
        intermediate = _size(config, "intermediate_size")
        if intermediate is None:
            if family.gated_mlp and not experts:
                raise ValueError("config.json lacks intermediate_size")
            intermediate = 4 * hidden  # GPT-2's n_inner default
        moe_layers = shared = 0
        if experts:
            dense_first = int(config.get("first_k_dense_replace") or 0)
            dense_only = set(config.get("mlp_only_layers") or ())
            step = int(config.get("decoder_sparse_step") or 1)
            moe_layers = sum(1 for layer in range(layers)
                             if layer >= dense_first and layer not in dense_only and (layer + 1) % step == 0)
            shared = int(config.get("shared_expert_intermediate_size") or 0)
            if not shared and config.get("n_shared_experts"):
                shared = int(config["n_shared_experts"]) * int(config.get("moe_intermediate_size") or intermediate)
        positions = int(config.get(family.learned_positions) or 0) if family.learned_positions else 0
        return cls(
            hidden_size=hidden,
            intermediate_size=intermediate,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=int(config.get("num_key_value_heads") or heads),
            vocab_size=sizes["vocab_size"],
            # transformers' Llama/Mistral/Qwen2 configs default to untied heads
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            head_dim=int(config["head_dim"]) if config.get("head_dim") else None,
            attention_bias=bool(config.get("attention_bias", family.linear_bias)),
            qkv_bias=family.qkv_bias,
            mlp_bias=bool(config.get("mlp_bias", family.linear_bias)),
            gated_mlp=family.gated_mlp,
            layer_norm=family.layer_norm,
            norms_per_layer=family.norms_per_layer,
            qk_norm=family.qk_norm,
            position_embeddings=positions,
            fused_qkv=family.fused_qkv,
            fused_gate_up=family.fused_gate_up,
            num_experts=experts,
            experts_per_token=int(config.get("num_experts_per_tok") or 1) if experts else 0,
            expert_intermediate_size=int(config.get("moe_intermediate_size") or intermediate) if experts else 0,
            shared_intermediate_size=shared,
            moe_layers=moe_layers,
        )

    # -- derived sizes ---------------------------------------------------------------

    @property
    def dim_per_head(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.dim_per_head

    @property
    def kv_dim(self) -> int:
        return self.num_key_value_heads * self.dim_per_head

    @property
    def mlp_roles(self) -> tuple[str, ...]:
        return ("gate_proj", "up_proj", "down_proj") if self.gated_mlp else ("up_proj", "down_proj")

    @property
    def dense_layers(self) -> int:
        return self.num_hidden_layers - self.moe_layers

    def linear_shapes(self, intermediate: int | None = None) -> dict[str, tuple[int, int]]:
        """(in_features, out_features) of each linear layer of a dense decoder layer, by its role,
        named as Llama names them (a fused projection counts as the roles it holds); with
        `intermediate`, an MLP of that width (an expert's)."""
        h, i = self.hidden_size, self.intermediate_size if intermediate is None else intermediate
        shapes = {"q_proj": (h, self.q_dim), "k_proj": (h, self.kv_dim), "v_proj": (h, self.kv_dim),
                  "o_proj": (self.q_dim, h), "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}
        if not self.gated_mlp:
            del shapes["gate_proj"]
        return shapes

    def attention_parameters(self) -> int:
        weights = sum(fan_in * fan_out for name, (fan_in, fan_out) in self.linear_shapes().items()
                      if name in ATTENTION_ROLES)
        if self.attention_bias:
            weights += self.q_dim + 2 * self.kv_dim + self.hidden_size
        elif self.qkv_bias:
            weights += self.q_dim + 2 * self.kv_dim
        return weights

    def mlp_parameters(self, intermediate: int) -> int:
        weights = sum(fan_in * fan_out for name, (fan_in, fan_out) in self.linear_shapes(intermediate).items()
                      if name in self.mlp_roles)
        if self.mlp_bias:
            weights += (len(self.mlp_roles) - 1) * intermediate + self.hidden_size
        return weights

    def layer_linear_parameters(self, moe: bool = False) -> int:
        """Weights (and biases) of the linear layers of one decoder layer (a mixture-of-experts one
        with `moe`: every expert, the router and the shared expert)."""
        if not moe:
            return self.attention_parameters() + self.mlp_parameters(self.intermediate_size)
        experts = self.num_experts * self.mlp_parameters(self.expert_intermediate_size)
        shared = self.mlp_parameters(self.shared_intermediate_size) if self.shared_intermediate_size else 0
        return self.attention_parameters() + experts + shared + self.num_experts * self.hidden_size

    def norm_parameters(self) -> int:
        """Of one decoder layer: its norms (and the per-head q/k norms)."""
        per_norm = self.hidden_size * (2 if self.layer_norm else 1)
        return self.norms_per_layer * per_norm + (2 * self.dim_per_head if self.qk_norm else 0)

    def layer_parameters(self, moe: bool = False) -> int:
        return self.layer_linear_parameters(moe) + self.norm_parameters()

    def linear_parameters(self) -> int:
        """The linear layers (and experts) of every decoder layer: what QLoRA quantizes."""
        return (self.dense_layers * self.layer_linear_parameters()
                + self.moe_layers * self.layer_linear_parameters(moe=True))

    def largest_linear(self) -> int:
        """Elements of the largest weight matrix of a dense layer (or of one expert)."""
        return max(fan_in * fan_out for fan_in, fan_out in self.linear_shapes().values())

    def embedding_parameters(self) -> int:
        """Input embeddings and output head (one matrix when tied), and learned positions."""
        return (self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)
                + self.position_embeddings * self.hidden_size)

    def parameters(self) -> int:
        """Total parameters (tied embeddings counted once), as `model.num_parameters()` counts them."""
        final_norm = self.hidden_size * (2 if self.layer_norm else 1)
        return (self.dense_layers * self.layer_parameters() + self.moe_layers * self.layer_parameters(moe=True)
                + self.embedding_parameters() + final_norm)

    def adapters(self, names: Sequence[str], intermediate: int | None = None) -> list[tuple[int, int]]:
        """(in_features, out_features) of each LoRA adapter a layer gets for the roles `names`
        (see `lora_target_names`): one per linear layer, so one for a fused projection's roles."""
        shapes = self.linear_shapes(intermediate)
        groups = [("q_proj", "k_proj", "v_proj")] if self.fused_qkv else [("q_proj",), ("k_proj",), ("v_proj",)]
        groups.append(("o_proj",))
        if self.gated_mlp:
            groups += [("gate_proj", "up_proj")] if self.fused_gate_up else [("gate_proj",), ("up_proj",)]
        else:
            groups.append(("up_proj",))
        groups.append(("down_proj",))
        return [(shapes[group[0]][0], sum(shapes[role][1] for role in group))
                for group in groups if any(role in names for role in group)]

    def lora_parameters(self, rank: int, targets: str | Sequence[str] = "all-linear") -> int:
        """Trainable parameters of a LoRA adapter: rank x (in + out) for every adapted linear.
        A mixture-of-experts layer's experts are weight tensors, not linear layers: 'all-linear'
        leaves them and the router alone, as PEFT does, and adapts its attention and shared expert."""
        names = lora_target_names(targets, self)
        dense = sum(rank * (fan_in + fan_out) for fan_in, fan_out in self.adapters(names))
        moe = sum(rank * (fan_in + fan_out) for fan_in, fan_out in self.adapters(
            [name for name in names if name in ATTENTION_ROLES]))
        if self.shared_intermediate_size:
            moe += sum(rank * (fan_in + fan_out) for fan_in, fan_out in self.adapters(
                [name for name in names if name not in ATTENTION_ROLES], self.shared_intermediate_size))
        return self.dense_layers * dense + self.moe_layers * moe


ATTENTION_ROLES = ("q_proj", "k_proj", "v_proj", "o_proj")

# Module names of other families, by the roles (Llama's names) their layers play; a fused
# projection plays several. GPT-2's `c_proj` is both the attention's output and the MLP's down.
ROLE_ALIASES: dict[str, tuple[str, ...]] = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"), "c_attn": ("q_proj", "k_proj", "v_proj"),
    "query_key_value": ("q_proj", "k_proj", "v_proj"), "Wqkv": ("q_proj", "k_proj", "v_proj"),
    "W_pack": ("q_proj", "k_proj", "v_proj"),
    "query": ("q_proj",), "key": ("k_proj",), "value": ("v_proj",), "q_lin": ("q_proj",), "k_lin": ("k_proj",),
    "v_lin": ("v_proj",), "dense": ("o_proj",), "out_proj": ("o_proj",), "c_proj": ("o_proj", "down_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"), "w1": ("gate_proj",), "w3": ("up_proj",), "w2": ("down_proj",),
    "c_fc": ("up_proj",), "fc1": ("up_proj",), "fc_in": ("up_proj",), "dense_h_to_4h": ("up_proj",),
    "fc2": ("down_proj",), "fc_out": ("down_proj",), "dense_4h_to_h": ("down_proj",),
}


def lora_target_names(targets: str | Sequence[str], shape: ModelShape | None = None) -> list[str]:
    """PEFT `target_modules` as the roles of a decoder layer's linears, named as Llama names them
    ('all-linear': every one of them; the output head is never adapted). Other families' names
    (`c_attn`, `qkv_proj`, `dense_h_to_4h`...) map to the roles they play (`ROLE_ALIASES`)."""
    roles = list(shape.linear_shapes()) if shape is not None else list(LINEAR_NAMES)
    if targets == "all-linear":
        return roles
    names = [targets] if isinstance(targets, str) else list(targets)
    unknown = [name for name in names if name not in LINEAR_NAMES and name not in ROLE_ALIASES]
    if unknown:
        raise ValueError(f"unknown LoRA target module(s) {unknown}; known: "
                         f"{', '.join([*LINEAR_NAMES, *ROLE_ALIASES])}")
    wanted = {role for name in names for role in ROLE_ALIASES.get(name, (name,))}
    return [role for role in roles if role in wanted]


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

    @property
    def total_bytes(self) -> int:
        """Weights, gradients, optimizer states and overhead are resident throughout. On top of
        them: the saved activations plus either the loss buffers (at the loss) or a layer's
        backward (after the loss buffers are freed); or else the optimizer step's scratch —
        whichever is largest (activations are gone by the optimizer step)."""
        return (self.weights + self.gradients + self.optimizer + self.overhead
                + max(self.activations + max(self.logits, self.backward), self.optimizer_step))

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
) -> MemoryEstimate:
    """Predicted peak memory of one training process, by part.

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

    a = weight_bytes
    h, i, L = shape.hidden_size, shape.intermediate_size, shape.num_hidden_layers
    H, head_dim = shape.num_attention_heads, shape.dim_per_head
    q, kv = shape.q_dim, shape.kv_dim
    B, S = micro_batch_size, seq_len
    T = B * S
    P = shape.parameters()
    full = training_type == "full"
    adapter = not full
    targets = lora_target_names(lora_targets, shape) if adapter else []
    N = P if full else shape.lora_parameters(lora_rank, targets)
    mixed = a < 4

    # experts are one tensor per kind and layer (all experts' gate+up, all experts' down)
    expert_stack = shape.num_experts * (len(shape.mlp_roles) - 1) * shape.expert_intermediate_size * h

    # -- resident state -----------------------------------------------------------------
    if training_type == "qlora":
        quantized = shape.linear_parameters()
        weights = quantized * NF4_BYTES_PER_PARAM + (P - quantized) * 4 + N * 4
    elif training_type == "lora":
        weights = P * a + N * 4
    else:
        weights = P * a
    gradients = N * (a if full else 4)
    param_bytes = a if full else 4  # the trainable parameters' dtype
    master = P * 4 if (full and mixed and optimizer in ("adamw", "adamw_8bit")) else 0
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
        largest = max(shape.largest_linear(), h * shape.vocab_size, expert_stack)
        if not full:  # the largest LoRA matrix, r x in or out x r
            largest = max(max(adapter) for adapter in shape.adapters(targets)) * lora_rank
        step_scratch = 2 * largest * param_bytes  # sqrt of the second moment, then its scaled copy

    # -- activations, per token -------------------------------------------------------------
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
            adapted = shape.adapters([name for name in targets
                                      if name in ATTENTION_ROLES or any(trainable for _, _, trainable in mlps)])
            lora = 4 * len(adapted) * lora_rank  # each adapter's r-wide intermediate
            if lora_dropout > 0:  # a dropped-out copy of the input and its mask, per adapter
                lora += ((4 if mixed else a) + 1) * sum(fan_in for fan_in, _ in adapted)
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
    logits = LOSS_BYTES_PER_LOGIT * T * shape.vocab_size
    # gradients in flight through a layer's backward (the MLP's three i-wide ones, two for a plain
    # MLP, and two h-wide), and with checkpointing the layer's activations, recomputed just before
    backward = T * ((mlp_factor * a * mlp_width + 2 * a * h) + (per_layer if gradient_checkpointing else 0))

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
    )


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
