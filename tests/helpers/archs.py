"""Tiny random-weight causal LMs of several decoder architectures, with the demo tokenizer.

Each model is built from a transformers config (`AutoConfig.for_model`) with a
handful of layers and a hidden size of 32, so that one training step takes a
few milliseconds on a CPU, and is saved with `save_pretrained` beside the
demo's byte-level BPE tokenizer (vocabulary 1024, ChatML chat template): the
trainer, the exporter and the inference engine load the folder like any hub
model. Nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

# Shared by the Llama-like decoders: 4 query heads of 8 dimensions over 2 key/value heads.
_DECODER = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}
# Windows shorter than a packed row, so the sliding-window layers really slide.
_WINDOW = 16

# model_type -> tiny settings. Only what is needed to make the model small (and, for
# sliding-window models, to make the window matter) is set; everything else keeps
# the architecture's own defaults, tied embeddings and attention implementation included.
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "llama": dict(_DECODER),
    "mistral": {**_DECODER, "sliding_window": _WINDOW},
    "qwen2": dict(_DECODER),
    "qwen3": {**_DECODER, "head_dim": 8},
    "gemma2": {**_DECODER, "head_dim": 8, "sliding_window": _WINDOW, "query_pre_attn_scalar": 8},
    # One local and one global layer (by default both of 2 layers would be local).
    "gemma3_text": {**_DECODER, "head_dim": 8, "sliding_window": _WINDOW, "query_pre_attn_scalar": 8,
                    "layer_types": ["sliding_attention", "full_attention"]},
    "phi3": {**_DECODER, "original_max_position_embeddings": 256},
    "gpt_neox": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                 "max_position_embeddings": 256},
    # Dropout off (GPT-2's config turns it on), as in the other architectures' configs: a step
    # then computes the same whether its examples are packed or not.
    "gpt2": {"n_embd": 32, "n_inner": 64, "n_layer": 2, "n_head": 4, "n_positions": 256,
             "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0},
    # Mixture of experts: 4 experts, 2 routed per token, in both layers.
    "qwen3_moe": {**_DECODER, "head_dim": 8, "num_experts": 4, "num_experts_per_tok": 2,
                  "moe_intermediate_size": 32, "decoder_sparse_step": 1, "mlp_only_layers": []},
}


def build_arch_model(model_type: str, out_dir: Path, *, seed: int = 0) -> Path:
    """Write a random `model_type` causal LM of `ARCHITECTURES[model_type]`'s size and the demo
    tokenizer into `out_dir` (vocabulary and BOS/EOS/PAD ids taken from the tokenizer).
    The same arguments give the same weights; the caller's global RNG is left untouched."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from tuneforge.demo.tiny_model import build_tokenizer, save_model_folder

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    config = AutoConfig.for_model(
        model_type, **ARCHITECTURES[model_type], vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    return save_model_folder(model, tokenizer, out_dir)
