"""Base model cache and the LoRA wrapper."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.helpers.tiny import BASE_MODEL_NAME, BASE_MODEL_SHA
from tuneforge.domain.spec import BaseModelRef, LoraConfig
from tuneforge.storage import layout
from tuneforge.storage.store import open_store
from tuneforge.train.model import (
    build_lora_model,
    fetch_base_model,
    linear_module_names,
    load_base_model,
)

LLAMA_LINEARS = ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]


def test_fetch_downloads_once_per_sha(tmp_path: Path, tiny_model_dir: Path) -> None:
    store = open_store(str(tmp_path / "objects"))
    prefix = layout.base_model_prefix(BASE_MODEL_NAME, BASE_MODEL_SHA)
    store.upload_dir(tiny_model_dir, prefix)
    ref = BaseModelRef(BASE_MODEL_NAME, BASE_MODEL_SHA, prefix)
    local = fetch_base_model(store, ref, tmp_path / "cache")
    assert local == tmp_path / "cache" / BASE_MODEL_SHA
    assert (local / "model.safetensors").read_bytes() == (tiny_model_dir / "model.safetensors").read_bytes()
    store.delete_prefix(prefix)  # a second fetch must not need the store any more
    assert fetch_base_model(store, ref, tmp_path / "cache") == local
    assert not list((tmp_path / "cache").glob(".*partial*"))


def test_all_linear_means_every_linear_layer_but_the_head(tiny_model_dir: Path) -> None:
    model, _ = load_base_model(tiny_model_dir, torch.device("cpu"))
    assert linear_module_names(model) == LLAMA_LINEARS
    peft_model = build_lora_model(model, LoraConfig(rank=4, alpha=8), seed=0)
    trainable = [name for name, p in peft_model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    assert not any("lm_head" in name for name in trainable)
    adapted = {name.split(".lora_")[0].rsplit(".", 1)[-1] for name in trainable}
    assert sorted(adapted) == LLAMA_LINEARS


def test_lora_initialisation_follows_the_seed(tiny_model_dir: Path) -> None:
    def lora_a(seed: int) -> torch.Tensor:
        model, _ = load_base_model(tiny_model_dir, torch.device("cpu"))
        peft_model = build_lora_model(model, LoraConfig(rank=4, alpha=8), seed=seed)
        return next(p for n, p in peft_model.named_parameters() if "lora_A" in n).detach().clone()

    assert torch.equal(lora_a(1), lora_a(1))
    assert not torch.equal(lora_a(1), lora_a(2))
