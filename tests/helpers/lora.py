"""LoRA adapters with random, non-zero weights in PEFT's format, and the
references that serving them must match: a fresh base model, and that base
with exactly one adapter loaded by `PeftModel.from_pretrained`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from tuneforge.domain.spec import BaseModelRef
from tuneforge.serve.params import ModelTarget
from tuneforge.storage import layout
from tuneforge.storage.store import ObjectStore


def save_random_lora(base_dir: Path, out_dir: Path, *, seed: int, rank: int = 4,
                     target_modules: Sequence[str] = ("q_proj", "v_proj")) -> Path:
    """An adapter whose A and B are both random (PEFT's `init_lora_weights=False`), so it
    changes the model's outputs from the first token on, unlike a freshly initialised one."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_dir)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=list(target_modules),
                        init_lora_weights=False, task_type="CAUSAL_LM")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        peft_model = get_peft_model(model, config)
    peft_model.save_pretrained(out_dir)
    return Path(out_dir)


def plain_model(model_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir).eval()


def reference_model(base_dir: Path, adapter_dir: Path | None) -> Any:
    """A fresh base, with one adapter on it when `adapter_dir` is given."""
    model = plain_model(base_dir)
    if adapter_dir is None:
        return model
    from peft import PeftModel

    return PeftModel.from_pretrained(model, str(adapter_dir)).eval()


def reference_logits(model: Any, token_ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([token_ids])).logits[0].float()


def greedy_ids(model: Any, prompt_ids: list[int], max_new_tokens: int, eos_id: int) -> list[int]:
    """transformers' own greedy `generate`: what the engine's decoding loop must reproduce."""
    with torch.inference_mode():
        output = model.generate(input_ids=torch.tensor([prompt_ids]), attention_mask=torch.ones(1, len(prompt_ids),
                                dtype=torch.long), max_new_tokens=max_new_tokens, do_sample=False,
                                eos_token_id=eos_id, pad_token_id=eos_id)
    return output[0, len(prompt_ids):].tolist()


BASE_NAME = "tiny-chat"
BASE_SHA = "b" * 64


def stage_base(store: ObjectStore, base_dir: Path, name: str = BASE_NAME, sha256: str = BASE_SHA) -> BaseModelRef:
    prefix = layout.base_model_prefix(name, sha256)
    store.upload_dir(base_dir, prefix)
    return BaseModelRef(name, sha256, prefix)


def stage_adapter(store: ObjectStore, base: BaseModelRef, adapter_dir: Path, *, tenant_id: str,
                  job_id: str, kind: str = "adapter") -> ModelTarget:
    prefix = layout.artifact_prefix(tenant_id, job_id, kind)
    store.upload_dir(adapter_dir, prefix)
    return ModelTarget(f"ft:{base.name}:{tenant_id}::{job_id}", base, artifact_prefix=prefix, artifact_kind=kind)
