"""Merged weights load in transformers alone and give base + adapter's logits; the adapter
folder has the layout vLLM's multi-LoRA serving loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from tuneforge.db.tables import FineTunedModel
from tuneforge.domain.errors import ApiError
from tuneforge.registry import export, lineage
from tuneforge.storage import layout
from tuneforge.storage.store import open_store

TENANT, JOB = "tenant-a", "ftjob-export"


def _adapter(model_dir: Path, out: Path) -> Path:
    """A LoRA adapter with random (non-zero) weights on every linear layer, saved as PEFT does."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                           "up_proj", "down_proj"], init_lora_weights=False)
    peft_model = get_peft_model(base, config)
    peft_model.peft_config["default"].base_model_name_or_path = "tiny-base"
    peft_model.save_pretrained(out, safe_serialization=True, save_embedding_layers=False)
    return out


@pytest.fixture
def registered(tmp_path, tiny_model_dir):
    store = open_store(str(tmp_path / "objects"))
    base_prefix = layout.base_model_prefix("tiny-base", "a" * 64)
    store.upload_dir(tiny_model_dir, base_prefix)
    prefix = layout.artifact_prefix(TENANT, JOB, "adapter")
    store.upload_dir(_adapter(tiny_model_dir, tmp_path / "adapter"), prefix)
    row = FineTunedModel(model_id="ft:tiny-base:acme::x1", tenant_id=TENANT, job_id=JOB, base_model="tiny-base",
                         base_model_sha256="a" * 64, artifact_prefix=prefix, created_at=0, artifact_kind="adapter",
                         lineage={"artifact": {"files": lineage.artifact_digests(store, prefix)}})
    return store, row, base_prefix


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


# fp32: the same sums in another order; bf16: every weight rounded to 8 bits of mantissa
@pytest.mark.parametrize("dtype, max_error, mean_error", [("fp32", 1e-4, 1e-5), ("bf16", 0.5, 0.05)])
def test_merged_weights_give_the_logits_of_base_plus_adapter(registered, tmp_path, tiny_model_dir, dtype,
                                                             max_error, mean_error):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    store, row, base_prefix = registered
    prefix = export.build_merged(store, row, "a" * 64, base_prefix, dtype, tmp_path / "cache")
    assert prefix == layout.merged_prefix(TENANT, JOB, dtype)
    folder = tmp_path / "merged"
    store.download_prefix(prefix, folder)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in folder.iterdir()}
    merged = AutoModelForCausalLM.from_pretrained(folder)  # transformers alone, no PEFT
    expected_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    assert next(merged.parameters()).dtype == expected_dtype
    reference = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32),
                                          tmp_path / "adapter").eval()
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    ids = torch.randint(5, 200, (2, 24), generator=torch.Generator().manual_seed(1))
    want, got = _logits(reference, ids), _logits(merged.eval(), ids)
    assert (want - _logits(base, ids)).abs().mean() > 10 * mean_error  # the adapter really changes the logits
    assert (want - got).abs().max() < max_error and (want - got).abs().mean() < mean_error
    # built once: a second request reuses the stored merge
    marker = store.get_bytes(f"{prefix}/.complete")
    assert export.build_merged(store, row, "a" * 64, base_prefix, dtype, tmp_path / "cache") == prefix
    assert store.get_bytes(f"{prefix}/.complete") == marker


def test_a_merge_refuses_artifacts_changed_after_registration(registered, tmp_path):
    store, row, base_prefix = registered
    store.put_bytes(f"{row.artifact_prefix}/adapter_config.json", b"{}")
    with pytest.raises(ApiError) as caught:
        export.build_merged(store, row, "a" * 64, base_prefix, "fp16", tmp_path / "cache")
    assert caught.value.code == "artifact_modified"
    assert store.list(layout.merged_prefix(TENANT, JOB, "fp16")) == []


def assert_vllm_adapter_layout(folder: Path, *, rank: int, alpha: int, base_model: str) -> None:
    """What vLLM's multi-LoRA loader reads: a PEFT LoRA config and safetensors named by module path,
    with no embedding or output-head weights."""
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in folder.iterdir()}
    assert {p.name for p in folder.iterdir()} <= {"adapter_config.json", "adapter_model.safetensors", "README.md",
                                             "tuneforge.json"}
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == rank and config["lora_alpha"] == alpha
    assert set(config["target_modules"]) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                             "down_proj"}
    assert config["base_model_name_or_path"] == base_model
    with safe_open(folder / "adapter_model.safetensors", framework="pt") as tensors:
        names = list(tensors.keys())
    assert names and all(n.startswith("base_model.model.model.layers.") for n in names)
    assert all(n.endswith((".lora_A.weight", ".lora_B.weight")) for n in names)
    assert not any("embed_tokens" in n or "lm_head" in n for n in names)


def test_the_adapter_folder_has_the_layout_vllm_loads(registered, tmp_path):
    store, row, _ = registered
    folder = tmp_path / "download"
    store.download_prefix(row.artifact_prefix, folder)
    assert_vllm_adapter_layout(folder, rank=4, alpha=8, base_model="tiny-base")
