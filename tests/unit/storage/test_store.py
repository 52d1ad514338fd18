"""FsspecStore over a local folder (the embedded default)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.store_contract import StoreContract
from tuneforge.storage import FsspecStore, open_store


@pytest.fixture
def store(tmp_path: Path) -> FsspecStore:
    return open_store(str(tmp_path / "objects"))


class TestLocalStore(StoreContract):
    pass


def test_objects_are_plain_files_under_the_root(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "objects"))
    store.put_bytes("tenants/t1/files/f/train.jsonl", b"{}\n")
    assert (tmp_path / "objects/tenants/t1/files/f/train.jsonl").read_bytes() == b"{}\n"


def test_file_url_and_relative_path_roots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    via_url = open_store(f"file://{tmp_path}/by-url/")
    via_url.put_bytes("k", b"1")
    assert (tmp_path / "by-url/k").read_bytes() == b"1"

    monkeypatch.chdir(tmp_path)
    relative = open_store("./rel/objects")
    relative.put_bytes("k", b"2")
    assert (tmp_path / "rel/objects/k").read_bytes() == b"2"
    assert relative.list("k") == ["k"]


def test_delete_prefix_removes_the_folder_itself(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "objects"))
    store.put_bytes("jobs/j/checkpoints/step-1/a", b"x")
    store.delete_prefix("jobs/j/checkpoints/step-1")
    assert not (tmp_path / "objects/jobs/j/checkpoints/step-1").exists()
    assert (tmp_path / "objects/jobs/j/checkpoints").is_dir()


def test_refused_key_writes_nothing_outside_the_root(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "objects"))
    with pytest.raises(ValueError):
        store.put_bytes("../escaped", b"x")
    assert not (tmp_path / "escaped").exists()
