"""Atomic checkpoints in the object store.

A checkpoint is a folder `.../checkpoints/step-{n}/` of files plus
`manifest.json`, which lists every file's SHA-256 and size and is written
LAST. Object stores have no rename, so the manifest is the commit record: a
folder without a manifest, or whose files do not match it, is not a checkpoint
and is skipped when resuming.

`save_training_state` / `restore_training_state` decide what goes in: the
trainable weights and the optimizer state through torch.distributed.checkpoint
(`state-*`, written by every rank together and readable on any number of
processes), an adapter's weights and config whole (safetensors), LR scheduler,
every rank's RNG state and the trainer state (step, epoch, data position,
history): everything exact resume needs.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import random
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.torch
import torch

from tuneforge.domain import retention
from tuneforge.storage import layout
from tuneforge.storage.store import ObjectStore
from tuneforge.train.distributed import unwrap

log = logging.getLogger(__name__)

MANIFEST_FORMAT = 1
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
STATE_PREFIX = "state-"  # weights and optimizer: torch.distributed.checkpoint's files, named with this prefix
MODEL_WEIGHTS = "model.safetensors"  # full fine-tunes, checkpoints of earlier releases
OPTIMIZER = "optimizer.pt"  # checkpoints of earlier releases
SCHEDULER = "scheduler.pt"
RNG_STATE = "rng_state.pt"
TRAINER_STATE = layout.TRAINER_STATE_NAME


@dataclass(frozen=True)
class Checkpoint:
    step: int
    prefix: str
    files: dict[str, bytes]
    manifest: dict[str, Any]


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_checkpoint(store: ObjectStore, prefix: str, files: Mapping[str, bytes], *, step: int) -> dict[str, Any]:
    """Write `files` under `prefix`, then the manifest; returns the manifest."""
    if layout.MANIFEST_NAME in files:
        raise ValueError(f"{layout.MANIFEST_NAME} is reserved for the checkpoint manifest")
    # A leftover from an earlier attempt at this step must not vouch for new files.
    store.delete(layout.checkpoint_manifest_key(prefix))
    store.delete_prefix(prefix)
    return _write_manifest(store, prefix, _upload(store, prefix, files), step)


def _upload(store: ObjectStore, prefix: str, files: Mapping[str, bytes]) -> dict[str, dict[str, Any]]:
    """Put `files` under `prefix`; their manifest entries."""
    entries = {}
    for name in sorted(files):
        data = files[name]
        store.put_bytes(layout.checkpoint_file_key(prefix, name), data)
        entries[name] = {"sha256": _sha256(data), "size_bytes": len(data)}
    return entries


def _write_manifest(store: ObjectStore, prefix: str, entries: dict[str, dict[str, Any]], step: int) -> dict[str, Any]:
    manifest = {"format": MANIFEST_FORMAT, "step": int(step), "created_at": time.time(), "files": entries}
    store.put_bytes(layout.checkpoint_manifest_key(prefix), json.dumps(manifest, indent=2, sort_keys=True).encode())
    return manifest


def read_checkpoint(store: ObjectStore, prefix: str) -> Checkpoint | None:
    """The checkpoint at `prefix` if its manifest is present and every file matches it."""
    try:
        manifest = json.loads(store.get_bytes(layout.checkpoint_manifest_key(prefix)))
        entries = manifest["files"]
        step = int(manifest["step"])
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None
    files = {}
    for name, entry in entries.items():
        try:
            data = store.get_bytes(layout.checkpoint_file_key(prefix, name))
        except FileNotFoundError:
            log.warning("checkpoint %s: %s is missing", prefix, name)
            return None
        if len(data) != entry.get("size_bytes") or _sha256(data) != entry.get("sha256"):
            log.warning("checkpoint %s: %s does not match its manifest", prefix, name)
            return None
        files[name] = data
    return Checkpoint(step=step, prefix=prefix, files=files, manifest=manifest)


def checkpoint_dirs(store: ObjectStore, checkpoints_prefix: str) -> list[tuple[int, str]]:
    """`(step, prefix)` of every step folder under `checkpoints_prefix`, newest first."""
    found: dict[int, str] = {}
    base = checkpoints_prefix.rstrip("/") + "/"
    for key in store.list(checkpoints_prefix):
        child = key[len(base):].split("/", 1)[0] if key.startswith(base) else ""
        step = layout.checkpoint_step(child) if child else None
        if step is not None:
            found[step] = base + child
    return sorted(found.items(), reverse=True)


def latest_valid_checkpoint(store: ObjectStore, checkpoints_prefix: str) -> Checkpoint | None:
    """The newest checkpoint whose manifest and files verify; corrupt ones are skipped."""
    for step, prefix in checkpoint_dirs(store, checkpoints_prefix):
        checkpoint = read_checkpoint(store, prefix)
        if checkpoint is not None:
            return checkpoint
        log.warning("skipping checkpoint at step %d: incomplete or corrupt", step)
    return None


def delete_checkpoint(store: ObjectStore, prefix: str) -> None:
    # Manifest first: a half-deleted folder then reads as incomplete, never as valid.
    store.delete(layout.checkpoint_manifest_key(prefix))
    store.delete_prefix(prefix)


def prune_checkpoints(store: ObjectStore, checkpoints_prefix: str, keep_last: int, by_epoch: bool = False
                      ) -> list[str]:
    """Delete the complete checkpoints `domain.retention` does not keep (by epoch: those neither
    the newest nor among the newest `keep_last` epoch ends), and any incomplete folder older than
    the newest kept one."""
    dirs = checkpoint_dirs(store, checkpoints_prefix)
    complete = [(step, prefix) for step, prefix in dirs if store.exists(layout.checkpoint_manifest_key(prefix))]
    if keep_last <= 0 or not complete:
        return []
    ends = {step: by_epoch and _ends_epoch(store, prefix) for step, prefix in complete}
    kept = retention.kept_steps(ends.items(), keep_last, by_epoch)
    newest_kept = max(kept)
    doomed = [prefix for step, prefix in dirs if step not in kept and (step in ends or step < newest_kept)]
    for prefix in doomed:
        delete_checkpoint(store, prefix)
    return doomed


def _ends_epoch(store: ObjectStore, prefix: str) -> bool:
    """Whether the checkpoint at `prefix` was written as an epoch ended (its data position is the
    start of the next epoch)."""
    try:
        state = json.loads(store.get_bytes(layout.trainer_state_key(prefix)))
    except (OSError, ValueError):
        return False
    return int(state.get("step", 0)) > 0 and int(state.get("index_in_epoch", -1)) == 0


def delete_checkpoints_after(store: ObjectStore, checkpoints_prefix: str, step: int) -> list[str]:
    """Remove folders newer than the checkpoint a run resumes from (they failed to verify)."""
    doomed = [prefix for dir_step, prefix in checkpoint_dirs(store, checkpoints_prefix) if dir_step > step]
    for prefix in doomed:
        delete_checkpoint(store, prefix)
    return doomed


# -- what a training checkpoint holds ------------------------------------------


def torch_bytes(obj: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def torch_from_bytes(data: bytes) -> Any:
    # weights_only: a checkpoint file must never be able to run code when loaded.
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


def capture_rng_state() -> dict[str, Any]:
    """Python, NumPy, torch and (when present) CUDA generator states."""
    numpy_state = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        # Plain lists so the file loads with weights_only=True.
        "numpy": [numpy_state[0], numpy_state[1].tolist(), *numpy_state[2:]],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, position, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), position, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _jsonable(value: Any) -> Any:
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if hasattr(value, "value"):  # enums in PEFT configs
        return value.value
    raise TypeError(f"cannot store {type(value).__name__} in a checkpoint config")


def _model_and_optimizer_state(model: Any, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """What `torch.distributed.checkpoint` saves and loads: the trainable weights and the
    optimizer state, keyed by parameter name (not position), whole or sharded as the model
    is — which is what lets a checkpoint load on another number of processes."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer, options=_state_options())
    return {"model": model_state, "optimizer": optimizer_state}


def _state_options() -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # the frozen base of an adapter is not saved: it comes from the base model again
    return StateDictOptions(ignore_frozen_params=True, strict=False)


def save_training_state(
    store: ObjectStore, prefix: str, *, step: int, model: Any, optimizer: torch.optim.Optimizer, scheduler: Any,
    trainer_state: dict[str, Any], dist: Any,
) -> None:
    """Write the checkpoint of a model in training at `prefix`; every rank of `dist` calls it.

    `state-*`: weights and optimizer through `torch.distributed.checkpoint`, each rank writing
    its own shards (`state-__{rank}_0.distcp`) and rank 0 the `state-.metadata` that maps every tensor
    to where its pieces lie. Beside it, from rank 0: an adapter's weights and config whole
    (what serving a checkpoint reads), the LR schedule, every rank's RNG state and the
    trainer state. The manifest, with every rank's files, is written last."""
    import torch.distributed.checkpoint as dcp

    dist.reshard(model)
    with tempfile.TemporaryDirectory(prefix="tuneforge-checkpoint-") as folder:
        dcp.save(_model_and_optimizer_state(model, optimizer), storage_writer=dcp.FileSystemWriter(folder),
                 no_dist=not dist.enabled)
        files = {STATE_PREFIX + path.name: path.read_bytes() for path in sorted(Path(folder).iterdir())
                 if path.is_file()}
    adapter = dist.full_state(model, trainable_only=True) if hasattr(model, "peft_config") else None
    rng_states = dist.gather(capture_rng_state())
    if dist.main:
        if adapter is not None:
            from peft import get_peft_model_state_dict

            weights = get_peft_model_state_dict(unwrap(model), state_dict=adapter)
            files[ADAPTER_WEIGHTS] = safetensors.torch.save(
                {name: tensor.contiguous() for name, tensor in weights.items()})
            files[ADAPTER_CONFIG] = json.dumps(model.peft_config["default"].to_dict(), default=_jsonable,
                                               sort_keys=True).encode()
        files[SCHEDULER] = torch_bytes(scheduler.state_dict())
        files[RNG_STATE] = torch_bytes({"ranks": rng_states})  # in rank order
        files[TRAINER_STATE] = json.dumps(trainer_state, sort_keys=True).encode()
        # A leftover from an earlier attempt at this step must not vouch for new files.
        store.delete(layout.checkpoint_manifest_key(prefix))
        store.delete_prefix(prefix)
    dist.barrier()
    entries = _upload(store, prefix, files)
    every_rank = dist.gather(entries)
    if dist.main:
        _write_manifest(store, prefix, {name: entry for part in every_rank for name, entry in part.items()}, step)
    dist.barrier()


def restore_training_state(
    files: Mapping[str, bytes], model: Any, optimizer: torch.optim.Optimizer, scheduler: Any, rank: int = 0,
    world: int = 1,
) -> tuple[dict[str, Any], bool]:
    """Load a checkpoint's files into the live objects: the trainer state, and whether this
    rank's RNG state was in it (not when the checkpoint was written by another number of
    processes: the caller then seeds the rank afresh)."""
    if STATE_PREFIX + ".metadata" in files:
        _load_model_and_optimizer(files, model, optimizer, distributed=world > 1)
    else:  # written by a release before torch.distributed.checkpoint
        _load_legacy(files, model, optimizer)
    scheduler.load_state_dict(torch_from_bytes(files[SCHEDULER]))
    rng = torch_from_bytes(files[RNG_STATE])
    ranks = rng.get("ranks", [rng])
    restored = len(ranks) == world
    if restored:
        restore_rng_state(ranks[rank])
    else:
        log.info("checkpoint written by %d process(es), resumed on %d: RNG states seeded afresh", len(ranks), world)
    return json.loads(files[TRAINER_STATE]), restored


def _load_model_and_optimizer(files: Mapping[str, bytes], model: Any, optimizer: torch.optim.Optimizer, *,
                              distributed: bool) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    state = _model_and_optimizer_state(model, optimizer)
    with tempfile.TemporaryDirectory(prefix="tuneforge-checkpoint-") as folder:
        for name, data in files.items():
            if name.startswith(STATE_PREFIX):
                (Path(folder) / name[len(STATE_PREFIX):]).write_bytes(data)
        try:
            dcp.load(state, storage_reader=dcp.FileSystemReader(folder), no_dist=not distributed)
        except Exception as exc:  # noqa: BLE001 - DCP raises its own CheckpointException for a missing key
            raise ValueError(f"checkpoint state does not fit the model: {str(exc)[:300]}") from exc
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"],
                   options=_state_options())


def _load_legacy(files: Mapping[str, bytes], model: Any, optimizer: torch.optim.Optimizer) -> None:
    if MODEL_WEIGHTS in files:
        saved = safetensors.torch.load(files[MODEL_WEIGHTS])
        result = model.load_state_dict(saved, strict=False)
        tied = {name for name, _ in model.state_dict().items()} - set(saved)
        if result.unexpected_keys or set(result.missing_keys) - tied:
            mismatched = (result.unexpected_keys or result.missing_keys)[:3]
            raise ValueError(f"checkpoint weights do not fit the model: {mismatched}")
    else:
        from peft import set_peft_model_state_dict

        adapter = safetensors.torch.load(files[ADAPTER_WEIGHTS])
        result = set_peft_model_state_dict(model, adapter)
        unexpected = [key for key in getattr(result, "unexpected_keys", []) if "lora_" in key]
        if unexpected:
            raise ValueError(f"checkpoint adapter does not fit the model: {unexpected[:3]}")
    optimizer.load_state_dict(torch_from_bytes(files[OPTIMIZER]))
