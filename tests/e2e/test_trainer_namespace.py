"""TUNEFORGE_TRAINER_ISOLATION=namespace: the local executor's trainers run in a mount namespace of
their own (bubblewrap) where the platform's home shows only the attempt's folder and the base-model
cache. A job trains and succeeds so; from inside the same namespace, the database, the secrets key,
the control plane's files and another attempt's spec (with its job token) are not there to read."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import start_plane
from tests.e2e.test_lifecycle import create_demo_job, wait_for
from tests.helpers import ray_cluster
from tuneforge.executors.protocol import Placement

# sqlite_pass_only: what a namespace hides does not depend on the backend (on PostgreSQL the test
# plants a stand-in database file), and a job's database work is covered on both backends elsewhere
pytestmark = [pytest.mark.e2e, pytest.mark.sqlite_pass_only,
              pytest.mark.skipif(not shutil.which("bwrap"), reason="needs bubblewrap")]

_PROBE = r"""
import json, os, sys
answers = {}
for name, path in json.loads(sys.argv[1]).items():
    try:
        with open(path, "rb") as handle:
            handle.read(1)
        answers[name] = "read"
    except OSError as exc:
        answers[name] = type(exc).__name__
answers["home lists"] = sorted(os.listdir(sys.argv[2]))
print(json.dumps(answers))
"""


@pytest.mark.skipif(ray_cluster.ray_stage(), reason="an option of the local executor")
def test_a_trainer_in_its_namespace_trains_and_sees_none_of_the_platforms_files(tmp_path: Path, database_url,
                                                                                 tiny_model_dir) -> None:
    world = start_plane(tmp_path, database_url, tiny_model_dir, trainer_isolation="namespace")
    try:
        sdk = world.sdk(world.key_a)
        job, _files = create_demo_job(sdk, tmp_path, {"n_epochs": 2})
        done = wait_for(sdk, job.id)
        assert done.status == "succeeded", done.error

        executor = world.plane.executor
        home = world.plane.platform.settings.home.resolve()
        world.plane.platform.sealer.seal("x")  # the secrets key file exists
        attempts = sorted(p for p in (home / "attempts").iterdir() if p.is_dir())
        assert attempts, "each isolated attempt has a folder of its own"
        own = attempts[0]
        other = own.with_name("ftjob-other-attempt-1")
        other.mkdir()
        (other / "ftjob-other-attempt-1.json").write_text('{"job_token": "theirs"}')
        database = home / "tuneforge.db"  # where the embedded default keeps it (this test's may be elsewhere)
        if not database.exists():
            database.write_bytes(b"SQLite format 3\x00")
        targets = {
            "own spec": str(next(own.glob("*.json"))),
            "secrets key": str(home / "secrets.key"),
            "database": str(database),
            "other attempt's spec": str(other / "ftjob-other-attempt-1.json"),
        }
        assert all(Path(path).exists() for path in targets.values()), targets  # all there on the host
        argv, env = executor.isolated([sys.executable, "-c", _PROBE, json.dumps(targets), str(home)], own,
                                      executor.attempt_env(Placement("local", [0])))
        seen = json.loads(subprocess.run(argv, env=env, capture_output=True, text=True, check=True,
                                         timeout=60).stdout)
        assert seen["own spec"] == "read"
        assert seen["secrets key"] == seen["database"] == seen["other attempt's spec"] == "FileNotFoundError"
        assert seen["home lists"] == sorted({"attempts", "cache"})  # what the namespace shows of the home
    finally:
        world.close()
