"""Base-model tokenizers for dataset checks, loaded once per model SHA."""

from __future__ import annotations

import threading
from functools import lru_cache
from pathlib import Path
from typing import Any

from tuneforge.db.tables import BaseModelRow
from tuneforge.domain.spec import BaseModelRef
from tuneforge.storage.model_cache import fetch_base_model
from tuneforge.storage.store import ObjectStore

_lock = threading.Lock()


@lru_cache(maxsize=8)
def _load(local_dir: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(local_dir)


def tokenizer_for(store: ObjectStore, base: BaseModelRow, cache_dir: Path) -> Any:
    ref = BaseModelRef(name=base.name, sha256=base.sha256, prefix=base.prefix)
    with _lock:  # one download per model even when several jobs validate at once
        local = fetch_base_model(store, ref, cache_dir)
        return _load(str(local))
