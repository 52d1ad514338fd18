"""What a trainer can reach with what its executor hands it (docs/security.md): a running attempt's
JobSpec and environment open its own data, its base model and its job's folder through the control
plane, and nothing of another tenant's, and hold none of the platform's secrets.

The attempt's world is captured where the executor builds it (the spec it launches, the
environment it gives the trainer) and then used from a separate process, as the trainer's own
code (or tenant code inside it) would: `tuneforge.train.__main__._open_store`, with only that
environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.test_lifecycle import create_demo_job, wait_for
from tests.helpers.net import wait_until
from tuneforge.security.env import child_env

pytestmark = pytest.mark.e2e

ADMIN_KEY = "adm-planted-0f1e2d3c4b5a"

# Run with the attempt's environment only: each line is one try, answered "ok" or the refusal.
_PROBE = r"""
import json, sys
from tuneforge.domain.spec import JobSpec
from tuneforge.train.__main__ import _open_store

spec = JobSpec.read(sys.argv[1])
theirs = sys.argv[2]
store = _open_store(spec)
own = f"tenants/{spec.tenant_id}/jobs/{spec.job_id}/probe.txt"
tries = {
    "own training file": lambda: store.get_bytes(spec.training_file.key)[:1],
    "own base model": lambda: store.get_bytes(store.list(spec.base_model.prefix)[0])[:1],
    "own job folder": lambda: store.put_bytes(own, b"mine") or store.get_bytes(own),
    "other tenant's file": lambda: store.get_bytes(theirs)[:1],
    "other tenant's folder": lambda: store.list(theirs.rsplit("/", 2)[0]),
    "every tenant": lambda: store.list("tenants"),
    "overwrite theirs": lambda: store.put_bytes(theirs, b"overwritten"),
}
answers = {}
for name, attempt in tries.items():
    try:
        attempt()
        answers[name] = "ok"
    except Exception as exc:
        answers[name] = f"{type(exc).__name__}: {getattr(exc, 'status_code', '')} {getattr(exc, 'code', '')}"
print(json.dumps(answers))
"""


@pytest.fixture
def watched(tmp_path, database_url, tiny_model_dir):
    """A plane (the executor under test) whose launches are recorded: each attempt's spec and the
    environment the executor gave its trainer."""
    from tests.e2e.conftest import start_plane

    world = start_plane(tmp_path, database_url, tiny_model_dir, admin_api_key=ADMIN_KEY)
    executor = world.plane.executor
    seen: dict[str, list] = {"specs": [], "envs": []}
    launch, attempt_env = executor.launch, executor.attempt_env

    def recording_env(*args):
        env = attempt_env(*args)
        seen["envs"].append(dict(env))
        return env

    def recording_launch(spec, placement):
        seen["specs"].append(spec)
        return launch(spec, placement)

    executor.attempt_env, executor.launch = recording_env, recording_launch
    yield world, seen
    world.close()


def _secrets(world) -> dict[str, str]:
    settings = world.plane.platform.settings
    found = {"admin key": ADMIN_KEY, "database URL": settings.resolved_database_url}
    for name in ("s3_access_key_id", "s3_secret_access_key"):
        if getattr(settings, name):
            found[name] = getattr(settings, name)
    key_file = settings.home / "secrets.key"
    if settings.secrets_key:
        found["secrets key"] = settings.secrets_key
    elif key_file.is_file():
        found["secrets key"] = key_file.read_text().strip()
    return found


@pytest.mark.both_executors  # what a trainer is handed is each executor's own doing
def test_a_trainer_reaches_its_own_objects_and_nothing_else(watched, tmp_path):
    world, seen = watched
    other = world.sdk(world.key_b)
    upload = other.files.create(file=("secret.jsonl", b'{"prompt": "p", "completion": "globex only"}\n'),
                                purpose="fine-tune")
    store = world.plane.platform.store
    [theirs] = [key for key in store.list("tenants") if f"/{upload.id}/" in key]

    sdk = world.sdk(world.key_a)
    job, _files = create_demo_job(sdk, tmp_path)  # a minute or more of training: probed while it runs
    wait_for(sdk, job.id, statuses=("running",), timeout_s=120)
    wait_until(lambda: seen["specs"] and seen["envs"], 60, "the attempt to be launched")
    spec, env = seen["specs"][0], seen["envs"][0]

    # nothing of the platform's in what the trainer holds
    handed = spec.to_json() + json.dumps(env)
    for name, secret in _secrets(world).items():
        assert secret not in handed, f"the trainer was handed the {name}"
    assert not [name for name in env if name.startswith(("TUNEFORGE_S3_", "AWS_", "TUNEFORGE_DATABASE",
                                                         "TUNEFORGE_ADMIN", "TUNEFORGE_SECRETS"))]
    assert spec.storage_url.startswith("tuneforge+http") and store.url not in spec.storage_url

    spec_path = tmp_path / "attempt.json"
    spec_path.write_text(spec.to_json())
    os.chmod(spec_path, 0o600)
    # what the trainer's process has: the node's allow-listed variables and the executor's (for the
    # local executor `env` is that whole environment already; a Ray host adds its own allow-list)
    probe = subprocess.run([sys.executable, "-c", _PROBE, str(spec_path), theirs], env=child_env(env),
                           capture_output=True, text=True, timeout=120, cwd=str(tmp_path))
    assert probe.returncode == 0, probe.stderr[-3000:]
    answers = json.loads(probe.stdout.strip().splitlines()[-1])
    sdk.fine_tuning.jobs.cancel(job.id)

    for allowed in ("own training file", "own base model", "own job folder"):
        assert answers[allowed] == "ok", answers
    for refused in ("other tenant's file", "other tenant's folder", "every tenant", "overwrite theirs"):
        assert answers[refused].startswith("ObjectAccessError: 403 object_out_of_scope"), answers
    assert store.get_bytes(theirs) == b'{"prompt": "p", "completion": "globex only"}\n'
    assert Path(spec_path).stat().st_mode & 0o077 == 0
