"""Data at rest on a local disk is the platform user's only: the object store writes files 0600
in folders 0700 whatever the umask, and the trainer and CLI processes run with umask 077."""

from __future__ import annotations

import io
import os
import stat
import subprocess
import sys

from tuneforge.storage.store import open_store


def _mode(path) -> int:  # noqa: ANN001
    return stat.S_IMODE(os.stat(path).st_mode)


def test_objects_are_0600_in_0700_folders_even_under_a_permissive_umask(tmp_path):
    old = os.umask(0o022)
    try:
        store = open_store(str(tmp_path / "objects"))
        store.put_bytes("tenants/t1/files/file-1/train.jsonl", b"{}\n")
        store.put_stream("tenants/t1/jobs/j1/checkpoints/step-1/adapter.safetensors", io.BytesIO(b"w" * 10))
        source = tmp_path / "local.bin"
        source.write_bytes(b"x")
        store.put_file("tenants/t1/jobs/j1/results.csv", source)
    finally:
        os.umask(old)
    root = tmp_path / "objects"
    for path in root.rglob("*"):
        assert _mode(path) == (0o700 if path.is_dir() else 0o600), path
    assert _mode(root) == 0o700


def test_an_object_written_again_loses_a_wider_mode(tmp_path):
    store = open_store(str(tmp_path / "objects"))
    store.put_bytes("a/b.txt", b"1")
    os.chmod(tmp_path / "objects" / "a" / "b.txt", 0o644)
    store.put_bytes("a/b.txt", b"2")
    assert _mode(tmp_path / "objects" / "a" / "b.txt") == 0o600


def test_the_cli_runs_with_a_private_umask(tmp_path):
    env = {**os.environ, "TUNEFORGE_HOME": str(tmp_path / "home")}
    subprocess.run([sys.executable, "-m", "tuneforge.cli.main", "migrate"], env=env, check=True,
                   capture_output=True, timeout=120)
    database = tmp_path / "home" / "tuneforge.db"
    assert _mode(database) == 0o600


def test_attempt_specs_logs_and_folders_of_the_local_executor_are_private(tmp_path, monkeypatch):
    from tests.security.test_subprocess_env import _spec
    from tuneforge.executors.local import LocalExecutor
    from tuneforge.executors.protocol import Placement
    from tuneforge.settings import Settings

    class FakePopen:
        def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
            self.pid = 999_998

    monkeypatch.setattr(subprocess, "Popen", FakePopen)
    old = os.umask(0o022)
    try:
        executor = LocalExecutor(Settings(home=tmp_path / "home", trainer_warm_start=False))
        handle = executor.launch(_spec(), Placement(node="node-0", gpu_ids=[0]))
    finally:
        os.umask(old)
    assert _mode(handle["spec_path"]) == 0o600 and _mode(handle["log_path"]) == 0o600
    assert _mode(tmp_path / "home" / "attempts") == 0o700 and _mode(tmp_path / "home") == 0o700
