"""Base model fetch (loading is `modeling/base.py`), and what is trained: a LoRA adapter, a LoRA adapter on a
4-bit base (QLoRA), or every weight (full)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from tuneforge.domain.spec import LoraConfig
from tuneforge.modeling.base import (  # noqa: F401 - re-exported for the trainer's modules
    flash_attention_available,
    leaf_names,
    linear_module_names,
    load_base_model,
    load_tokenizer,
    lora_module_paths,
    model_dtype,
    unmatched_target_modules,
)
from tuneforge.storage.model_cache import default_cache_dir, fetch_base_model  # noqa: F401 - re-exported
from tuneforge.train.errors import UserInputError

log = logging.getLogger(__name__)

def load_spec_base(store: Any, spec: Any, device: torch.device) -> tuple[Any, Any]:
    """The job's base model loaded again, from this node's cache (fetched when missing): beside
    a full fine-tune for the eval, or on rank 0 for the weights gathered from a sharded run."""
    base_dir = fetch_base_model(store, spec.base_model, Path(spec.cache_dir) if spec.cache_dir else None)
    return load_base_model(base_dir, device)


def prepare_trainable(model: Any, training_type: str, lora: LoraConfig, *, seed: int,
                      gradient_checkpointing: bool = False) -> Any:
    """LoRA / QLoRA: the base frozen, an adapter on top. Full: every weight trains.
    `gradient_checkpointing`: recompute each layer's activations in the backward pass
    (the planner asks for it when a job would not fit otherwise)."""
    if gradient_checkpointing and training_type != "qlora":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if training_type != "full":
            model.enable_input_require_grads()  # the frozen embeddings must still pass gradients on
    if training_type == "full":
        model.requires_grad_(True)
        return model
    if training_type == "qlora":
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=True)
    return build_lora_model(model, lora, seed=seed)


def is_adapter(model: Any) -> bool:
    return hasattr(model, "peft_config")


def build_lora_model(model: Any, lora: LoraConfig, *, seed: int) -> Any:
    """Freeze the base and wrap it with LoRA; the adapter's initial weights follow `seed`."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    if lora.target_modules == "all-linear":
        targets: list[str] | str = linear_module_names(model)
    else:
        targets = list(lora.target_modules) if isinstance(lora.target_modules, list) else lora.target_modules
    config = PeftLoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=targets,
        task_type="CAUSAL_LM",
    )
    torch.manual_seed(seed)
    try:
        return get_peft_model(model, config)
    except ValueError as exc:  # peft: no module matches, or a match it cannot adapt
        if lora.target_modules == "all-linear":
            raise  # chosen by the platform, not the tenant
        raise UserInputError(
            "invalid_target_modules",
            f"training_type.target_modules {targets if isinstance(targets, list) else [targets]} cannot be adapted "
            "in this base model; "
            f"modules LoRA can adapt here include {', '.join(leaf_names(lora_module_paths(model))[:8])}",
            param="training_type.target_modules",
        ) from exc


def load_adapter_weights(store: Any, model: Any, prefix: str) -> int:
    """Start the adapter from the one at `prefix` (a continued job's parent's): every LoRA weight
    of the model must get one of its tensors, of the same shape. How many tensors were loaded."""
    import safetensors.torch
    from peft import set_peft_model_state_dict

    weights = safetensors.torch.load(store.get_bytes(f"{prefix.rstrip('/')}/adapter_model.safetensors"))
    result = set_peft_model_state_dict(model, weights)
    unexpected = [key for key in getattr(result, "unexpected_keys", []) if "lora_" in key]
    missing = [key for key in getattr(result, "missing_keys", []) if "lora_" in key]
    if unexpected or missing:
        raise ValueError(f"the parent's adapter does not fit this model: unexpected {unexpected[:3]}, "
                         f"missing {missing[:3]}")
    return len(weights)


def trainable_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [param for param in model.parameters() if param.requires_grad]
