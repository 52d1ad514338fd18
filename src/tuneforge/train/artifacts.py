"""A finished attempt's files: the adapter in PEFT format, a full fine-tune's
weights with its tokenizer, and the per-step results CSV."""

from __future__ import annotations

import csv
import io
import json
import tempfile
from pathlib import Path
from typing import Any

from tuneforge.domain.spec import BaseModelRef
from tuneforge.storage.store import ObjectStore

RESULTS_COLUMNS = ["step", "train_loss", "train_accuracy", "valid_loss", "valid_mean_token_accuracy"]


ADAPTER_METADATA = "tuneforge.json"


def upload_adapter(model: Any, base: BaseModelRef, job_id: str, store: ObjectStore, adapter_prefix: str) -> list[str]:
    """The adapter in PEFT format: `AutoPeftModelForCausalLM.from_pretrained(folder)` loads it
    with its base, which `adapter_config.json` names by what it was registered from (a hub id or
    a path; the trainer's cache path and the platform's alias mean nothing elsewhere). The alias
    and the base's digest are kept in `tuneforge.json` beside it."""
    model.peft_config["default"].base_model_name_or_path = base.source or base.name
    with tempfile.TemporaryDirectory(prefix="tuneforge-adapter-") as tmp:
        model.save_pretrained(tmp, safe_serialization=True, save_embedding_layers=False)
        metadata = {"job_id": job_id, "base_model": base.name, "base_model_sha256": base.sha256,
                    "base_model_source": base.source or None}
        (Path(tmp) / ADAPTER_METADATA).write_text(json.dumps(metadata, indent=2) + "\n")
        store.delete_prefix(adapter_prefix)
        return store.upload_dir(Path(tmp), adapter_prefix)


def upload_full_model(model: Any, tokenizer: Any, store: ObjectStore, prefix: str) -> list[str]:
    """A full fine-tune: weights and tokenizer as `from_pretrained` loads them."""
    with tempfile.TemporaryDirectory(prefix="tuneforge-model-") as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        store.delete_prefix(prefix)
        return store.upload_dir(Path(tmp), prefix)


def results_csv(history: list[dict[str, Any]]) -> bytes:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=RESULTS_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in history:
        writer.writerow({key: "" if row.get(key) is None else row[key] for key in RESULTS_COLUMNS})
    return buffer.getvalue().encode()
