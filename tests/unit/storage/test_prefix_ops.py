"""The prefix operations every store shares (storage.store.PrefixOps), over a store whose objects
live in a dict: a folder up and back down, the folders under a prefix."""

from __future__ import annotations

from pathlib import Path

from tuneforge.storage.proxy import ProxyStore
from tuneforge.storage.store import FsspecStore, PrefixOps


class DictStore(PrefixOps):
    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}

    def list(self, prefix: str) -> list[str]:
        return sorted(key for key in self.objects if key.startswith(prefix.strip("/") + "/"))

    def get_file(self, key: str, local_path: Path) -> None:
        local_path.parent.mkdir(parents=True, exist_ok=True)
        local_path.write_bytes(self.objects[key])

    def put_file(self, key: str, local_path: Path) -> None:
        self.objects[key] = local_path.read_bytes()


def test_a_folder_goes_up_and_comes_back_and_its_folders_are_listed(tmp_path: Path) -> None:
    source = tmp_path / "adapter"
    (source / "sub").mkdir(parents=True)
    (source / "adapter_config.json").write_text("{}")
    (source / "sub" / "weights.bin").write_bytes(b"\x00\x01")
    store = DictStore()
    assert store.upload_dir(source, "jobs/j1/adapter") == ["jobs/j1/adapter/adapter_config.json",
                                                            "jobs/j1/adapter/sub/weights.bin"]
    written = store.download_prefix("jobs/j1/adapter", tmp_path / "back")
    assert sorted(p.relative_to(tmp_path / "back").as_posix() for p in written) == ["adapter_config.json",
                                                                                   "sub/weights.bin"]
    assert (tmp_path / "back" / "sub" / "weights.bin").read_bytes() == b"\x00\x01"
    assert list(store.iter_dirs("jobs/j1")) == ["jobs/j1/adapter"]


def test_both_stores_take_them_from_the_one_place() -> None:
    for cls in (FsspecStore, ProxyStore):
        for name in ("upload_dir", "download_prefix", "iter_dirs"):
            assert getattr(cls, name) is getattr(PrefixOps, name), (cls, name)
