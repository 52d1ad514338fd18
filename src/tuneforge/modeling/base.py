"""Loading a base model and naming its modules: what the trainer and the serving engine share.

`load_base_model` reads a local folder (`storage/model_cache.py` fetches it)
into a model and tokenizer in the device's dtype; the module-name helpers say
which layers LoRA can adapt and check a tenant's `target_modules` against them.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from tuneforge.modeling.errors import UnsupportedJob

log = logging.getLogger(__name__)

# Output projections are never adapted: they map to the vocabulary, not a hidden state.
_OUTPUT_LAYER_NAMES = ("lm_head",)


def load_base_model(local_dir: Path, device: torch.device, *, quantize_4bit: bool = False,
                    place: bool = True) -> tuple[Any, Any]:
    """Model (float32 on CPU, bfloat16 on a GPU that supports it) and tokenizer. `place`
    False leaves the weights in host memory, in the device's dtype (FSDP moves them to the
    device one sharded layer at a time).

    `quantize_4bit` (QLoRA): NF4 weights with double quantization and bf16
    compute, through bitsandbytes; it needs a CUDA GPU."""
    from transformers import AutoModelForCausalLM

    tokenizer = load_tokenizer(local_dir)
    dtype = model_dtype(device)
    if quantize_4bit:
        from transformers import BitsAndBytesConfig

        if device.type != "cuda":
            raise UnsupportedJob("QLoRA needs a CUDA GPU (4-bit NF4 weights through bitsandbytes); "
                                 "this trainer has none: use training_type 'lora'")
        quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                          bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=dtype)
        model = AutoModelForCausalLM.from_pretrained(local_dir, dtype=dtype, quantization_config=quantization,
                                                     device_map={"": device.index or 0})
        return model, tokenizer
    model = None
    if flash_attention_available(device, dtype):
        try:  # transformers' variable-length kernels for packed rows (train/attention.py)
            model = AutoModelForCausalLM.from_pretrained(local_dir, dtype=dtype,
                                                         attn_implementation="flash_attention_2")
        except (ValueError, ImportError) as exc:  # an architecture without flash-attention support
            log.info("flash-attention 2 not used: %s", exc)
    if model is None:
        model = AutoModelForCausalLM.from_pretrained(local_dir, dtype=dtype)
    if place:
        model.to(device)
    return model, tokenizer


def load_tokenizer(local_dir: Path) -> Any:
    """The base model's tokenizer, with a pad token (its EOS where it has none)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(local_dir)
    if tokenizer.pad_token_id is None:
        # Padding positions never carry loss or attention, so any id will do.
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def model_dtype(device: torch.device) -> torch.dtype:
    """bfloat16 on a GPU that supports it, else float32."""
    return torch.bfloat16 if device.type == "cuda" and torch.cuda.is_bf16_supported() else torch.float32


def flash_attention_available(device: torch.device, dtype: torch.dtype) -> bool:
    """A CUDA device, a half-precision dtype and the flash-attn package: what flash-attention 2 needs."""
    import importlib.util

    return (device.type == "cuda" and dtype in (torch.bfloat16, torch.float16)
            and importlib.util.find_spec("flash_attn") is not None)


def linear_module_names(model: torch.nn.Module) -> list[str]:
    """Leaf names of every linear layer (`nn.Linear`, its quantized subclasses, GPT-2 style
    `Conv1D`, fused projections such as `qkv_proj` or `query_key_value` alike) except the output
    layer: what 'all-linear' means, as in PEFT."""
    from transformers.pytorch_utils import Conv1D

    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    names = set()
    for qualified_name, module in model.named_modules():
        if not isinstance(module, (torch.nn.Linear, Conv1D)) or module is output:
            continue
        leaf = qualified_name.rsplit(".", 1)[-1]
        if leaf not in _OUTPUT_LAYER_NAMES:
            names.add(leaf)
    return sorted(names)


def lora_module_paths(model: torch.nn.Module) -> list[str]:
    """Qualified names of the modules LoRA can adapt: linear layers (and GPT-2 style Conv1D)
    first, then embeddings and convolutions. Reads only module types and names, so a model
    built on the `meta` device will do."""
    from transformers.pytorch_utils import Conv1D

    linear, other = [], []
    for qualified_name, module in model.named_modules():
        if isinstance(module, (torch.nn.Linear, Conv1D)):
            linear.append(qualified_name)
        elif isinstance(module, (torch.nn.Embedding, torch.nn.Conv1d, torch.nn.Conv2d)):
            other.append(qualified_name)
    return linear + other


def leaf_names(paths: list[str]) -> list[str]:
    """The distinct last parts of `paths`, in their first order: what a tenant usually names
    in `training_type.target_modules` (q_proj, v_proj, ...)."""
    return list(dict.fromkeys(path.rsplit(".", 1)[-1] for path in paths))


def unmatched_target_modules(paths: list[str], names: list[str]) -> list[str]:
    """The names of `names` that match none of `paths` the way PEFT matches a list of target
    modules: the whole qualified name, or its end after a dot."""
    return [name for name in names if not any(path == name or path.endswith("." + name) for path in paths)]
