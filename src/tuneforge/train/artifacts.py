"""A finished attempt's files: the adapter in PEFT format, a full fine-tune's
weights with its tokenizer, and the per-step results CSV."""

from __future__ import annotations

import csv
import io
import tempfile
from pathlib import Path
from typing import Any

from tuneforge.storage.store import ObjectStore

RESULTS_COLUMNS = ["step", "train_loss", "train_accuracy", "valid_loss", "valid_mean_token_accuracy"]


def upload_adapter(model: Any, base_model_name: str, store: ObjectStore, adapter_prefix: str) -> list[str]:
    """The adapter in PEFT format (`PeftModel.from_pretrained` loads the folder)."""
    # The local cache path means nothing to whoever loads the adapter; the model name does.
    model.peft_config["default"].base_model_name_or_path = base_model_name
    with tempfile.TemporaryDirectory(prefix="tuneforge-adapter-") as tmp:
        model.save_pretrained(tmp, safe_serialization=True, save_embedding_layers=False)
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
