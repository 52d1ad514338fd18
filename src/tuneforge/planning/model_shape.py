"""The sizes of a decoder-only transformer that training memory depends on, read from its
config.json alone (`ModelShape.from_config`): parameters by role, LoRA adapters, experts.

Pure Python (no torch), for the memory model (`planning/memory.py`) and the control plane's
planning. Module names play no part: each linear layer counts by the role it plays (Llama's
names), a fused projection as the roles it holds, and a small table says what each family
does differently (`FAMILIES`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# Linear layers of one decoder layer, by the leaf names PEFT targets ("all-linear" = all of them).
LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

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
        found = {key: _size(config, key) for key in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                                     "vocab_size")}
        missing = [key for key, value in found.items() if not value]
        if missing:
            raise ValueError(f"config.json lacks {', '.join(missing)}")
        sizes = {key: int(value or 0) for key, value in found.items()}
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
        groups: list[tuple[str, ...]] = \
            [("q_proj", "k_proj", "v_proj")] if self.fused_qkv else [("q_proj",), ("k_proj",), ("v_proj",)]
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
