"""Local copies of base models, one folder per SHA, shared by every process
on a host (trainers and the control plane's tokenizer loading)."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from tuneforge.domain.spec import BaseModelRef
from tuneforge.security.env import private_dirs
from tuneforge.storage import layout
from tuneforge.storage.store import ObjectStore

log = logging.getLogger(__name__)

_COMPLETE_MARKER = layout.COMPLETE_NAME
default_cache_dir = layout.default_base_model_cache_dir  # the folders themselves are layout's


def is_cached(ref: BaseModelRef, cache_dir: Path | None = None) -> bool:
    """Whether this host's cache already holds a complete copy of the base model."""
    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
    return (layout.cached_base_model_dir(cache_dir, ref.sha256) / _COMPLETE_MARKER).exists()


def fetch_base_model(store: ObjectStore, ref: BaseModelRef, cache_dir: Path | None = None) -> Path:
    """A local folder with the base model's files, downloaded once per SHA.

    The copy is assembled in a private folder and renamed into place, so
    trainers sharing the cache never see a half-written model.
    """
    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
    target = layout.cached_base_model_dir(cache_dir, ref.sha256)
    if (target / _COMPLETE_MARKER).exists():
        return target
    private_dirs(cache_dir)
    staging = cache_dir / f".{ref.sha256}.partial-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    written = store.download_prefix(ref.prefix, staging)
    if not written:
        shutil.rmtree(staging, ignore_errors=True)
        raise FileNotFoundError(f"no base model files under {ref.prefix!r}")
    (staging / _COMPLETE_MARKER).write_text(ref.sha256)
    if target.exists() and not (target / _COMPLETE_MARKER).exists():
        shutil.rmtree(target, ignore_errors=True)  # a copy that an earlier crash left unfinished
    try:
        staging.rename(target)
    except OSError:
        # Another trainer finished first; its copy is as good as ours.
        shutil.rmtree(staging, ignore_errors=True)
        if not (target / _COMPLETE_MARKER).exists():
            raise
    log.info("base model %s cached at %s (%d files)", ref.name, target, len(written))
    return target
