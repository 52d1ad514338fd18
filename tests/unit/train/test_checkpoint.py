"""Checkpoints: manifest last, corrupt or incomplete ones skipped, pruning, RNG."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tuneforge.storage import layout
from tuneforge.storage.store import FsspecStore, open_store
from tuneforge.train import checkpoint as ckpt

ROOT = layout.checkpoints_prefix("tenant-a", "ftjob-1")


class PutOrderStore:
    """Wraps a store and remembers the order in which keys were written."""

    def __init__(self, inner: FsspecStore) -> None:
        self.inner = inner
        self.written: list[str] = []

    def put_bytes(self, key: str, data: bytes) -> None:
        self.written.append(key)
        self.inner.put_bytes(key, data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.fixture
def store(tmp_path: Path) -> FsspecStore:
    return open_store(str(tmp_path / "objects"))


def _files(step: int) -> dict[str, bytes]:
    return {"adapter_model.safetensors": f"weights-{step}".encode(), "trainer_state.json": b"{}"}


def _write(store: Any, step: int) -> str:
    prefix = layout.checkpoint_prefix("tenant-a", "ftjob-1", step)
    ckpt.write_checkpoint(store, prefix, _files(step), step=step)
    return prefix


def test_manifest_is_written_last_and_lists_every_file_hash(store: FsspecStore) -> None:
    recording = PutOrderStore(store)
    prefix = _write(recording, 5)
    assert recording.written[-1] == f"{prefix}/manifest.json"
    assert sorted(recording.written[:-1]) == [f"{prefix}/adapter_model.safetensors", f"{prefix}/trainer_state.json"]
    manifest = json.loads(store.get_bytes(f"{prefix}/manifest.json"))
    assert manifest["step"] == 5
    assert manifest["files"]["adapter_model.safetensors"] == {
        "sha256": hashlib.sha256(b"weights-5").hexdigest(),
        "size_bytes": len(b"weights-5"),
    }
    loaded = ckpt.read_checkpoint(store, prefix)
    assert loaded is not None and loaded.files == _files(5)


def test_corrupt_newest_checkpoint_is_skipped_for_the_previous_one(store: FsspecStore) -> None:
    _write(store, 2)
    newest = _write(store, 4)
    store.put_bytes(f"{newest}/adapter_model.safetensors", b"weights-X")  # same size, other bytes
    found = ckpt.latest_valid_checkpoint(store, ROOT)
    assert found is not None and found.step == 2
    assert found.files["adapter_model.safetensors"] == b"weights-2"


@pytest.mark.parametrize("damage", ["no_manifest", "truncated_manifest", "missing_file"])
def test_incomplete_newest_checkpoint_does_not_exist(store: FsspecStore, damage: str) -> None:
    _write(store, 2)
    newest = _write(store, 4)
    manifest_key = f"{newest}/manifest.json"
    if damage == "no_manifest":
        store.delete(manifest_key)
    elif damage == "truncated_manifest":
        store.put_bytes(manifest_key, store.get_bytes(manifest_key)[:20])
    else:
        store.delete(f"{newest}/trainer_state.json")
    assert ckpt.latest_valid_checkpoint(store, ROOT).step == 2


def test_no_checkpoint_at_all(store: FsspecStore) -> None:
    assert ckpt.latest_valid_checkpoint(store, ROOT) is None


def test_rewriting_a_step_drops_the_old_files(store: FsspecStore) -> None:
    prefix = layout.checkpoint_prefix("tenant-a", "ftjob-1", 3)
    ckpt.write_checkpoint(store, prefix, {"old.bin": b"1", "a.bin": b"2"}, step=3)
    ckpt.write_checkpoint(store, prefix, {"a.bin": b"3"}, step=3)
    assert store.list(prefix) == [f"{prefix}/a.bin", f"{prefix}/manifest.json"]


def test_prune_keeps_the_newest_complete_checkpoints(store: FsspecStore) -> None:
    for step in (1, 2, 3, 4):
        _write(store, step)
    deleted = ckpt.prune_checkpoints(store, ROOT, keep_last=2)
    assert [layout.checkpoint_step(p) for p in deleted] == [2, 1]
    assert [step for step, _ in ckpt.checkpoint_dirs(store, ROOT)] == [4, 3]


def test_prune_by_epoch_keeps_epoch_ends_and_the_newest(store: FsspecStore) -> None:
    import json

    for step, index_in_epoch in ((3, 0), (4, 4), (6, 0), (8, 8)):
        prefix = layout.checkpoint_prefix("tenant-a", "ftjob-1", step)
        files = {**_files(step), "trainer_state.json": json.dumps(
            {"step": step, "epoch": step // 3, "index_in_epoch": index_in_epoch}).encode()}
        ckpt.write_checkpoint(store, prefix, files, step=step)
    deleted = ckpt.prune_checkpoints(store, ROOT, keep_last=1, by_epoch=True)
    assert [layout.checkpoint_step(p) for p in deleted] == [4, 3]
    assert [step for step, _ in ckpt.checkpoint_dirs(store, ROOT)] == [8, 6]


def test_delete_checkpoints_after_removes_newer_folders(store: FsspecStore) -> None:
    for step in (2, 4, 6):
        _write(store, step)
    ckpt.delete_checkpoints_after(store, ROOT, 2)
    assert [step for step, _ in ckpt.checkpoint_dirs(store, ROOT)] == [2]


def test_rng_state_round_trip_replays_the_same_numbers() -> None:
    state = ckpt.torch_from_bytes(ckpt.torch_bytes(ckpt.capture_rng_state()))
    first = (random.random(), float(np.random.rand()), torch.rand(3))
    ckpt.restore_rng_state(state)
    second = (random.random(), float(np.random.rand()), torch.rand(3))
    assert first[:2] == second[:2]
    assert torch.equal(first[2], second[2])
