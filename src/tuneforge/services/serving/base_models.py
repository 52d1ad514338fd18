"""Base models: registered once by an admin, copied into the object store and
pinned by a SHA-256 over their weight, config and tokenizer files."""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from pathlib import Path

from sqlalchemy.orm import Session

from tuneforge.db.repos import base_models as base_model_repo
from tuneforge.db.tables import BaseModelRow
from tuneforge.domain.digests import file_sha256
from tuneforge.domain.errors import conflict, invalid
from tuneforge.domain.job_config import TrainingType
from tuneforge.storage import layout
from tuneforge.storage.store import ObjectStore

# Files that define a model's behaviour; everything else (READMEs, images) is
# copied but does not change the pin.
_PINNED_SUFFIXES = (".safetensors", ".bin", ".json", ".model", ".txt", ".tiktoken", ".jinja")
_log = logging.getLogger(__name__)
_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def model_sha256(model_dir: Path) -> str:
    """SHA-256 over (relative path, file SHA-256) of every pinned file, sorted."""
    lines = []
    for path in sorted(p for p in model_dir.rglob("*") if p.is_file()):
        rel = path.relative_to(model_dir).as_posix()
        if rel.startswith(".") or not rel.endswith(_PINNED_SUFFIXES):
            continue
        lines.append(f"{rel}\t{file_sha256(path)}")
    if not lines:
        raise invalid(f"{model_dir} holds no model files (config, weights, tokenizer)", param="source")
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def resolve_source(source: str, cache_dir: Path) -> Path:
    """A local directory as is, or a hub id downloaded where the network allows."""
    local = Path(source).expanduser()
    if local.is_dir():
        return local.resolve()
    if local.exists():
        raise invalid(f"{source} is a file; give a model directory or a hub id", param="source")
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:  # pragma: no cover - transformers depends on it
        raise invalid(f"{source} is not a directory and huggingface_hub is missing") from exc
    try:
        return Path(snapshot_download(repo_id=source, cache_dir=str(cache_dir)))
    except Exception as exc:  # noqa: BLE001 - any hub failure is the user's to fix
        raise invalid(
            f"{source} is not a local directory and could not be fetched from the hub: {exc}",
            param="source",
        ) from exc


def _check_model_dir(model_dir: Path) -> int | None:
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise invalid(f"{model_dir} has no config.json", param="source")
    has_weights = any(model_dir.glob("*.safetensors")) or any(model_dir.glob("*.bin"))
    if not has_weights:
        raise invalid(f"{model_dir} has no weight files (*.safetensors or *.bin)", param="source")
    if not (model_dir / "tokenizer.json").is_file() and not (model_dir / "tokenizer_config.json").is_file():
        raise invalid(f"{model_dir} has no tokenizer files", param="source")
    config = json.loads(config_path.read_text())
    return config.get("max_position_embeddings")


_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                "F8_E4M3": 1, "F8_E5M2": 1, "BOOL": 1}


def count_parameters(model_dir: Path) -> int | None:
    """Parameters in the safetensors files, read from their headers (no weights loaded)."""
    total = 0
    for path in sorted(model_dir.glob("*.safetensors")):
        with open(path, "rb") as handle:
            header_len = int.from_bytes(handle.read(8), "little")
            if header_len <= 0 or header_len > 100 * 1024 * 1024:
                return None
            try:
                header = json.loads(handle.read(header_len))
            except ValueError:
                return None
        for name, entry in header.items():
            if name == "__metadata__" or not isinstance(entry, dict):
                continue
            count = 1
            for dim in entry.get("shape", []):
                count *= int(dim)
            total += count
    return total or None


def add_base_model(
    session: Session, store: ObjectStore, name: str, source: str, cache_dir: Path
) -> BaseModelRow:
    if not name or not set(name) <= _NAME_CHARS or name.startswith("ft:"):
        raise invalid("base model name may use letters, digits, '.', '_' and '-'", param="name")
    if base_model_repo.by_name(session, name) is not None:
        raise conflict(f"base model {name!r} is already registered", param="name")
    model_dir = resolve_source(source, cache_dir)
    max_positions = _check_model_dir(model_dir)
    sha256 = model_sha256(model_dir)
    prefix = layout.base_model_prefix(name, sha256)
    keys = store.upload_dir(model_dir, prefix)
    size_bytes = sum(p.stat().st_size for p in model_dir.rglob("*") if p.is_file())
    row = BaseModelRow(
        name=name,
        sha256=sha256,
        prefix=prefix,
        source=source,
        size_bytes=size_bytes,
        max_position_embeddings=max_positions,
        num_parameters=count_parameters(model_dir),
        created_at=int(time.time()),
    )
    session.add(row)
    session.flush()
    if not keys:
        raise invalid(f"nothing was copied from {source}", param="source")
    return row


def list_base_models(session: Session) -> list[BaseModelRow]:
    return base_model_repo.list_all(session)


def find(session: Session, name: str) -> BaseModelRow | None:
    """The base model registered as `name`, or None (base models are shared by every tenant)."""
    return base_model_repo.by_name(session, name)


def refuse_deleting(session: Session, model_id: str) -> None:
    """Base models are the platform's: a tenant deletes only its fine-tuned models."""
    if base_model_repo.by_name(session, model_id) is not None:
        raise invalid(f"{model_id} is a base model; only fine-tuned models can be deleted", param="model",
                      code="model_not_deletable")


# ---- the modules LoRA can adapt, per base model ----------------------------------------
_MODULES: dict[str, list[str] | None] = {}  # base model sha256 -> qualified module names
_MODULES_LOCK = threading.Lock()
TARGET_MODULES_PARAM = "training_type.target_modules"


def lora_module_paths(store: ObjectStore, base: BaseModelRow) -> list[str] | None:
    """Qualified names of the modules of `base` LoRA can adapt, or None when its config cannot
    be read or built. The model is built from its config.json on the `meta` device: module
    names and types, no weights, no memory for them. Cached per SHA-256 (a base model's files
    never change under the same SHA); torch loads on the first call only."""
    with _MODULES_LOCK:  # one build per model, however many creates ask at once
        if base.sha256 not in _MODULES:
            _MODULES[base.sha256] = _build_module_paths(store, base)
        return _MODULES[base.sha256]


def _build_module_paths(store: ObjectStore, base: BaseModelRow) -> list[str] | None:
    try:
        config = json.loads(store.get_bytes(layout.base_model_config_key(base.prefix)))
        import torch
        from transformers import AutoModelForCausalLM
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        from tuneforge.modeling.base import lora_module_paths as paths_of

        model_config = CONFIG_MAPPING[config["model_type"]].from_dict(config)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(model_config)
        return paths_of(model)
    except Exception:  # noqa: BLE001 - an unknown architecture, a broken config: the trainer still checks
        _log.warning("cannot list the modules of base model %s (%s); target_modules are checked by the "
                     "trainer only", base.name, base.sha256, exc_info=True)
        return None


def check_target_modules(store: ObjectStore, base: BaseModelRow, training_type: TrainingType | None) -> None:
    """400 naming `training_type.target_modules` when a module it names is not one LoRA can
    adapt in `base`, with some names that are."""
    targets = training_type.target_modules if training_type is not None else "all-linear"
    if targets == "all-linear" or training_type.type == "full":
        return
    from tuneforge.modeling.base import leaf_names, unmatched_target_modules

    if not targets:
        raise invalid(f"{TARGET_MODULES_PARAM} must name at least one module, or be \"all-linear\"",
                      param=TARGET_MODULES_PARAM, code="invalid_target_modules")
    paths = lora_module_paths(store, base)
    if paths is None:
        return
    unknown = unmatched_target_modules(paths, list(targets))
    if unknown:
        raise invalid(
            f"{TARGET_MODULES_PARAM}: {', '.join(repr(name) for name in unknown)} "
            f"{'is not a module' if len(unknown) == 1 else 'are not modules'} LoRA can adapt in {base.name}; "
            f"it has e.g. {', '.join(leaf_names(paths)[:8])} (or use \"all-linear\")",
            param=TARGET_MODULES_PARAM, code="invalid_target_modules")
