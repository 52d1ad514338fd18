"""How rank 0 starts the other ranks of a multi-process attempt on its host (train/distributed.py):
forked when that is safe, as fresh `python -m tuneforge.train SPEC` processes otherwise, each
with the allow-listed environment and torchrun's variables, and each a trainer that reads the
spec and exits with the trainer's codes (here: a spec that cannot be read, a platform error)."""

from __future__ import annotations

import os
import subprocess
import threading

import pytest

from tuneforge.domain.exit_codes import TrainerExit
from tuneforge.train import distributed


@pytest.fixture
def rank_zero_env(monkeypatch):
    """Rank 0's environment as its executor sets it, plus a variable that is not the platform's."""
    monkeypatch.setenv("TUNEFORGE_S3_REGION", "eu-test-1")
    monkeypatch.setenv("SOME_DEVELOPER_SECRET", "planted")
    for name in distributed.RENDEZVOUS_ENV:
        monkeypatch.delenv(name, raising=False)


def test_fork_safe_only_without_other_python_threads():
    assert distributed.fork_safe()
    release = threading.Event()
    thread = threading.Thread(target=release.wait)
    thread.start()
    try:
        assert not distributed.fork_safe()
    finally:
        release.set()
        thread.join()


def test_forked_ranks_run_the_trainer_with_the_worker_environment(tmp_path, rank_zero_env):
    spec_path = tmp_path / "missing-spec.json"
    workers = distributed.launch_workers(str(spec_path), 3)
    assert [type(worker) for worker in workers] == [distributed.ForkedRank] * 2
    distributed.stop_workers(workers, timeout_s=60)
    # the trainer ran in each: the spec cannot be read, a platform error, no exit file (not rank 0)
    assert [worker.returncode for worker in workers] == [TrainerExit.PLATFORM_ERROR] * 2
    assert not (tmp_path / "missing-spec.exit").exists()
    # rank 0's own environment now has torchrun's variables for rank 0
    assert (os.environ["RANK"], os.environ["WORLD_SIZE"]) == ("0", "3")


def test_a_forked_rank_gets_only_the_allow_listed_environment(tmp_path, rank_zero_env, monkeypatch):
    # the environment each forked child installs in place of rank 0's, written down by the child
    # before it runs the trainer
    seen = tmp_path / "seen"
    monkeypatch.setattr(distributed, "_become_worker", _reporting_worker(seen))
    workers = distributed.launch_workers(str(tmp_path / "spec.json"), 2)
    distributed.stop_workers(workers, timeout_s=60)
    env = dict(line.split("=", 1) for line in seen.read_text().splitlines())
    assert env["TUNEFORGE_S3_REGION"] == "eu-test-1"
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == ("1", "2", "1")
    assert "SOME_DEVELOPER_SECRET" not in env


def _reporting_worker(seen):
    real = distributed._become_worker

    def become(spec_path, env):
        seen.write_text("".join(f"{name}={value}\n" for name, value in env.items()))
        real(spec_path, env)

    return become


def test_ranks_start_as_fresh_processes_when_forking_is_not_safe(tmp_path, rank_zero_env, monkeypatch):
    monkeypatch.setattr(distributed, "fork_safe", lambda: False)
    workers = distributed.launch_workers(str(tmp_path / "missing-spec.json"), 2)
    assert [type(worker) for worker in workers] == [subprocess.Popen]
    assert workers[0].args[1:] == ["-m", "tuneforge.train", str(tmp_path / "missing-spec.json")]
    distributed.stop_workers(workers, timeout_s=120)
    assert workers[0].returncode == TrainerExit.PLATFORM_ERROR
