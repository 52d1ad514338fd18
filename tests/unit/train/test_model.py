"""Base model cache and the LoRA wrapper."""

from __future__ import annotations

from pathlib import Path

import pytest
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


# tiny random models of other families: their linear layers as transformers names them (GPT-2's
# are Conv1D; GPT-NeoX and Phi-3 fuse their projections), never the output head
ARCHITECTURES = {
    "gpt2": ({"n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 64, "vocab_size": 128},
             ["c_attn", "c_fc", "c_proj"]),
    "gpt_neox": ({"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
                  "max_position_embeddings": 64, "vocab_size": 128},
                 ["dense", "dense_4h_to_h", "dense_h_to_4h", "query_key_value"]),
    "phi3": ({"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
              "intermediate_size": 64, "max_position_embeddings": 64, "vocab_size": 128, "pad_token_id": 0},
             ["down_proj", "gate_up_proj", "o_proj", "qkv_proj"]),
}


@pytest.mark.parametrize("model_type", sorted(ARCHITECTURES))
def test_all_linear_covers_conv1d_and_fused_projections(model_type: str) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    settings, expected = ARCHITECTURES[model_type]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **settings))
    assert linear_module_names(model) == expected
    peft_model = build_lora_model(model, LoraConfig(rank=4, alpha=8), seed=0)
    trainable = [name for name, p in peft_model.named_parameters() if p.requires_grad]
    adapted = {name.split(".lora_")[0].rsplit(".", 1)[-1] for name in trainable}
    assert sorted(adapted) == expected and all("lora_" in name for name in trainable)
    # it trains: one step moves the adapter and the loss is finite
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    loss = peft_model(input_ids=ids, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in peft_model.parameters() if p.requires_grad)


def test_flash_attention_is_asked_for_only_where_it_can_run(monkeypatch) -> None:
    import importlib.util

    from tuneforge.train.model import flash_attention_available

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "flash_attn" else real_find_spec(name, *a))
    assert flash_attention_available(torch.device("cuda"), torch.bfloat16)
    assert not flash_attention_available(torch.device("cuda"), torch.float32)  # its kernels are half precision
    assert not flash_attention_available(torch.device("cpu"), torch.bfloat16)
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "flash_attn" else real_find_spec(name, *a))
    assert not flash_attention_available(torch.device("cuda"), torch.bfloat16)
