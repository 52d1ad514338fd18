"""Behaviour every ObjectStore must have; test modules subclass `StoreContract`
and provide a `store` fixture (local folder, moto S3, ...)."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from tuneforge.storage import layout

PAYLOAD = bytes(range(256)) * 4  # binary, with every byte value


class StoreContract:
    def test_put_and_get_bytes(self, store) -> None:
        store.put_bytes("a/b/c.bin", PAYLOAD)
        assert store.get_bytes("a/b/c.bin") == PAYLOAD
        store.put_bytes("a/b/c.bin", b"second")
        assert store.get_bytes("a/b/c.bin") == b"second"

    def test_empty_object(self, store) -> None:
        store.put_bytes("empty", b"")
        assert store.exists("empty")
        assert store.size_bytes("empty") == 0
        assert store.get_bytes("empty") == b""

    def test_get_missing_key_raises_file_not_found(self, store) -> None:
        with pytest.raises(FileNotFoundError):
            store.get_bytes("no/such/key")

    def test_put_stream_counts_bytes_across_chunks(self, store) -> None:
        data = os.urandom(5 * 1024 * 1024 + 123)  # more than one 4 MiB copy chunk
        written = store.put_stream("big/blob", io.BytesIO(data))
        assert written == len(data)
        assert store.size_bytes("big/blob") == len(data)
        assert store.get_bytes("big/blob") == data

    def test_put_file_get_file_and_open_read(self, store, tmp_path: Path) -> None:
        source = tmp_path / "source.jsonl"
        source.write_bytes(PAYLOAD)
        store.put_file("files/x.jsonl", source)
        target = tmp_path / "deep" / "er" / "copy.jsonl"
        store.get_file("files/x.jsonl", target)
        assert target.read_bytes() == PAYLOAD
        assert [p.name for p in target.parent.iterdir()] == ["copy.jsonl"]  # no .part left
        with store.open_read("files/x.jsonl") as handle:
            assert handle.read(16) == PAYLOAD[:16]

    def test_compose_puts_objects_together_in_the_order_given(self, store) -> None:
        pieces = {"u/p1": b"first-", "u/p2": os.urandom(4 * 1024 * 1024 + 7), "u/p3": b"-last"}
        for key, data in pieces.items():
            store.put_bytes(key, data)
        order = ["u/p3", "u/p1", "u/p2"]
        how = store.compose("files/whole", [(key, len(pieces[key])) for key in order])
        assert how == "streamed"  # small parts: S3's multipart copy would refuse them
        assert store.get_bytes("files/whole") == b"".join(pieces[key] for key in order)
        assert all(store.exists(key) for key in pieces)  # the sources stay until their owner deletes them

    def test_exists_and_size(self, store) -> None:
        assert not store.exists("d/one")
        store.put_bytes("d/one", b"12345")
        assert store.exists("d/one")
        assert store.exists("d")  # a prefix with objects under it
        assert not store.exists("d/two")
        assert store.size_bytes("d/one") == 5

    def test_list_is_recursive_sorted_and_relative(self, store) -> None:
        for key in ("p/z", "p/a/2", "p/a/1", "p/b/c/d", "other/x"):
            store.put_bytes(key, key.encode())
        assert store.list("p") == ["p/a/1", "p/a/2", "p/b/c/d", "p/z"]
        assert store.list("p/") == store.list("p")
        assert store.list("p/a") == ["p/a/1", "p/a/2"]
        assert store.list("missing") == []

    def test_list_does_not_leak_into_sibling_prefixes(self, store) -> None:
        base = layout.checkpoints_prefix("t1", "job-1")
        for step in (1, 10, 100):
            store.put_bytes(f"{layout.checkpoint_prefix('t1', 'job-1', step)}/weights", b"w")
        store.put_bytes(f"{base}/step-1.json", b"not a checkpoint folder")
        assert store.list(layout.checkpoint_prefix("t1", "job-1", 1)) == [f"{base}/step-1/weights"]
        steps = sorted(layout.checkpoint_step(d) for d in store.iter_dirs(base))
        assert steps == [1, 10, 100]

    def test_delete_and_delete_prefix(self, store) -> None:
        base = layout.checkpoints_prefix("t1", "job-1")
        for step in (1, 10):
            for name in ("weights.safetensors", "sub/optimizer.pt", layout.MANIFEST_NAME):
                store.put_bytes(f"{base}/step-{step}/{name}", b"x")
        store.delete(f"{base}/step-10/{layout.MANIFEST_NAME}")
        store.delete(f"{base}/step-10/{layout.MANIFEST_NAME}")  # missing: no error
        assert not store.exists(f"{base}/step-10/{layout.MANIFEST_NAME}")

        store.delete_prefix(f"{base}/step-1")
        assert store.list(f"{base}/step-1") == []
        assert not store.exists(f"{base}/step-1")
        assert store.list(f"{base}/step-10") == [
            f"{base}/step-10/sub/optimizer.pt",
            f"{base}/step-10/weights.safetensors",
        ]
        store.delete_prefix("never/written")  # missing: no error

    def test_upload_dir_download_prefix_round_trip(self, store, tmp_path: Path) -> None:
        source = tmp_path / "adapter"
        files = {
            "adapter_config.json": b"{}",
            "adapter_model.safetensors": PAYLOAD,
            "tokenizer/vocab.txt": b"a\nb\n",
        }
        for name, data in files.items():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            (source / name).write_bytes(data)
        prefix = layout.artifact_prefix("t1", "job-1", "adapter")

        keys = store.upload_dir(source, prefix)
        assert keys == [f"{prefix}/{name}" for name in sorted(files)]
        assert store.list(prefix) == keys

        target = tmp_path / "downloaded"
        written = store.download_prefix(prefix + "/", target)
        assert sorted(written) == sorted(target / name for name in files)
        for name, data in files.items():
            assert (target / name).read_bytes() == data

    @pytest.mark.parametrize("key", ["..", "../x", "a/../../x", "a/..", "", "/"])
    def test_keys_that_escape_or_are_empty_are_refused(self, store, key: str) -> None:
        with pytest.raises(ValueError, match="invalid object key"):
            store.put_bytes(key, b"x")
        with pytest.raises(ValueError, match="invalid object key"):
            store.get_bytes(key)
        with pytest.raises(ValueError, match="invalid object key"):
            store.delete_prefix(key)
        with pytest.raises(ValueError, match="invalid object key"):
            store.list(key)
