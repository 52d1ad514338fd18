"""Merged weights: base model + adapter folded into one set of full weights that
`transformers.AutoModelForCausalLM.from_pretrained` loads directly (no PEFT),
in bf16, fp16 or fp32 safetensors, with the tokenizer beside them.

Built on the first request for a dtype, then kept in the object store next to
the adapter (`layout.merged_prefix`), so later downloads are a copy. The
registered adapter's digests are checked before merging: a merged model is
never built from artifacts that changed after registration.

Needs enough memory for the base model in float32 while merging (the merge
is done in float32, then cast), on the control plane's host.
"""

from __future__ import annotations

import tempfile
import threading
from pathlib import Path

from tuneforge.db.tables import FineTunedModel
from tuneforge.domain.spec import BaseModelRef
from tuneforge.registry import models as registry
from tuneforge.storage import layout
from tuneforge.storage.model_cache import fetch_base_model
from tuneforge.storage.store import ObjectStore

DTYPES = ("bf16", "fp16", "fp32")
_LOCK = threading.Lock()  # one merge at a time per process: each holds a whole model in memory


def _is_built(store: ObjectStore, prefix: str) -> bool:
    return store.exists(layout.complete_marker_key(prefix))


def build_merged(store: ObjectStore, row: FineTunedModel, base_sha256: str, base_prefix: str, dtype: str,
                 cache_dir: Path) -> str:
    """Merge (once) and return the prefix holding config.json, model.safetensors and the tokenizer."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}")
    prefix = layout.merged_prefix(row.tenant_id, row.job_id, dtype) if row.job_id is not None \
        else f"{row.artifact_prefix}-merged/{dtype}"  # a model no job made: beside its adapter
    with _LOCK:
        if _is_built(store, prefix):
            return prefix
        registry.verify_artifacts(store, row)
        _merge_into(store, row, BaseModelRef(row.base_model, base_sha256, base_prefix), dtype, cache_dir, prefix)
    return prefix


def _merge_into(store: ObjectStore, row: FineTunedModel, base: BaseModelRef, dtype: str, cache_dir: Path,
                prefix: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    with tempfile.TemporaryDirectory(prefix="tuneforge-merge-") as tmp:
        work = Path(tmp)
        if row.artifact_kind == "model":  # a full fine-tune: its weights, cast
            store.download_prefix(row.artifact_prefix, work / "source")
            model = AutoModelForCausalLM.from_pretrained(work / "source", dtype=torch.float32)
            tokenizer = AutoTokenizer.from_pretrained(work / "source")
        else:
            from peft import PeftModel

            base_dir = fetch_base_model(store, base, cache_dir)
            store.download_prefix(row.artifact_prefix, work / "adapter")
            model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
            model = PeftModel.from_pretrained(model, work / "adapter").merge_and_unload()
            tokenizer = AutoTokenizer.from_pretrained(base_dir)
        model = model.to(torch_dtype)
        model.config.name_or_path = row.model_id
        out = work / "merged"
        model.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)
        card_key = f"{row.artifact_prefix.rstrip('/')}/README.md"
        if store.exists(card_key):  # the trainer's model card, now for full weights
            card = store.get_bytes(card_key).decode().replace("library_name: peft", "library_name: transformers", 1)
            (out / "README.md").write_text(card + f"\nMerged into full {dtype} weights for `{row.model_id}`.\n")
        store.delete_prefix(prefix)
        store.upload_dir(out, prefix)
        store.put_bytes(layout.complete_marker_key(prefix), row.model_id.encode())  # written last: the merge is whole
