"""How rank 0 starts the other ranks of a multi-process attempt on its host (train/distributed.py):
forked when that is safe, as fresh `python -m tuneforge.train SPEC` processes otherwise, each
with the allow-listed environment and torchrun's variables, and each a trainer that reads the
spec and exits with the trainer's codes (here: a spec that cannot be read, a platform error).

Forking is tried in a process of its own, as a trainer is: the test process may run threads."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tuneforge.domain.exit_codes import TrainerExit
from tuneforge.train import distributed

RANK_ZERO = """
import json, os, sys, threading
from tuneforge.train import distributed

spec_path, seen = sys.argv[1], sys.argv[2]
out = {"safe": distributed.fork_safe()}
release = threading.Event()
thread = threading.Thread(target=release.wait)
thread.start()
out["safe_beside_a_thread"] = distributed.fork_safe()
release.set()
thread.join()
real = distributed._become_worker

def become(spec, env):  # the environment each child installs, written down by the child
    with open(f"{seen}.{env['RANK']}", "w") as handle:
        json.dump(env, handle)
    real(spec, env)

distributed._become_worker = become
workers = distributed.launch_workers(spec_path, 3)
out["types"] = [type(worker).__name__ for worker in workers]
distributed.stop_workers(workers, timeout_s=60)
out["codes"] = [worker.returncode for worker in workers]
out["rank_zero"] = [os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["MASTER_PORT"]]
print(json.dumps(out))
"""


def test_a_thread_free_rank_zero_forks_its_ranks_each_with_only_the_allow_listed_environment(tmp_path):
    spec_path, seen = tmp_path / "missing-spec.json", tmp_path / "env"
    env = {name: value for name, value in os.environ.items() if name not in distributed.RENDEZVOUS_ENV}
    env.update({"TUNEFORGE_S3_REGION": "eu-test-1", "SOME_DEVELOPER_SECRET": "planted"})
    done = subprocess.run([sys.executable, "-c", RANK_ZERO, str(spec_path), str(seen)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.splitlines()[-1])
    assert (out["safe"], out["safe_beside_a_thread"]) == (True, False)
    assert out["types"] == ["ForkedRank", "ForkedRank"]
    # the trainer ran in each: the spec cannot be read, a platform error; only rank 0 leaves an exit file
    assert out["codes"] == [TrainerExit.PLATFORM_ERROR] * 2
    assert "cannot read the job spec" in done.stderr
    assert not (tmp_path / "missing-spec.exit").exists()
    port = out["rank_zero"][2]
    assert out["rank_zero"][:2] == ["0", "3"]
    for rank in (1, 2):
        child = json.loads((tmp_path / f"env.{rank}").read_text())
        assert (child["RANK"], child["WORLD_SIZE"], child["LOCAL_RANK"], child["MASTER_PORT"]) == \
            (str(rank), "3", str(rank), port)
        assert child["TUNEFORGE_S3_REGION"] == "eu-test-1"
        assert "SOME_DEVELOPER_SECRET" not in child


@pytest.fixture
def rank_zero_env(monkeypatch):
    """The test process's environment as it was, afterwards (launch_workers sets rank 0's torchrun
    variables in it)."""
    saved = dict(os.environ)
    for name in distributed.RENDEZVOUS_ENV:
        monkeypatch.delenv(name, raising=False)
    yield
    os.environ.clear()
    os.environ.update(saved)


def test_ranks_start_as_fresh_processes_when_forking_is_not_safe(tmp_path, rank_zero_env, monkeypatch):
    monkeypatch.setattr(distributed, "fork_safe", lambda: False)
    workers = distributed.launch_workers(str(tmp_path / "missing-spec.json"), 2)
    assert [type(worker) for worker in workers] == [subprocess.Popen]
    assert workers[0].args[1:] == ["-m", "tuneforge.train", str(tmp_path / "missing-spec.json")]
    distributed.stop_workers(workers, timeout_s=120)
    assert workers[0].returncode == TrainerExit.PLATFORM_ERROR
