"""Two control planes on one database: exactly one schedules; the other takes over when it dies.

The lock itself (what the database keeps of a leader): a process holding it and SIGKILLed leaves
it to a standby within seconds, on either backend (a PostgreSQL advisory lock on the holder's own
connection, or a file lock beside SQLite's database).

The whole takeover: both planes are real `tuneforge serve` processes sharing the database, the
object store and the home folder (as two hosts share a database and a bucket). The first to start
holds the scheduler lock. Jobs are created through the standby's API; the leader runs them. The
leader is SIGKILLed mid-training: the standby takes the lock within seconds, lets the orphaned
attempts' leases run out, stops them, and runs the jobs again from their checkpoints. No job ever
has two live attempts. It runs in the SQLite pass only: past the lock, its database work is that
of any job.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import openai
import pytest

from tests.e2e.test_restart import ServeProcess, trainer_pids, wait_until
from tests.helpers.net import free_port
from tests.helpers.platform import tenant_with_model
from tuneforge.demo.dataset import DEMO_LORA, write_demo_files
from tuneforge.scheduler.leader import LeaderLock, leader_known

pytestmark = [pytest.mark.e2e, pytest.mark.local_executor]

HYPERPARAMETERS = {"n_epochs": 20, "batch_size": 2, "learning_rate_multiplier": 1.0}
# what the standby waits, from its taking over, before it holds the orphaned attempts lost: a
# running trainer heartbeats every 0.5 s here; one still starting has the start timeout instead
LEASE_S = 8.0


# a process that takes the scheduler lock as a control plane does, says so, and waits to be killed
HOLD_THE_LOCK = """
import sys, time
from pathlib import Path
from tuneforge.scheduler.leader import LeaderLock
lock = LeaderLock(sys.argv[1], Path(sys.argv[2]))
assert lock.holds()
print("leading", flush=True)
time.sleep(300)
"""


def test_a_killed_leaders_lock_passes_to_the_standby_within_seconds(tmp_path, database_url):
    home = tmp_path / "home"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_THE_LOCK, database_url, str(home)],
                              stdout=subprocess.PIPE, text=True)
    standby = LeaderLock(database_url, home)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "leading"
        assert leader_known(database_url, home)
        assert not standby.holds()  # not while the holder lives
        assert not standby.holds()
        holder.kill()
        holder.wait(10)
        killed_at = time.monotonic()
        wait_until(standby.holds, 10, "the standby to take the lock", interval_s=0.05)
        took_s = time.monotonic() - killed_at
        assert leader_known(database_url, home)
        assert took_s < 5, f"took {took_s:.1f} s"
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(10)
        standby.release()
    assert not leader_known(database_url, home)  # released: free for the next


def _role(plane: ServeProcess) -> str | None:
    try:
        return httpx.get(f"{plane.url}/healthz", timeout=5, trust_env=False).json().get("scheduler")
    except httpx.HTTPError:
        return None


@pytest.mark.sqlite_pass_only
def test_one_leader_schedules_and_the_standby_takes_over(tmp_path, database_url, tiny_model_dir):
    home = tmp_path / "home"
    key = tenant_with_model(tmp_path, database_url, tiny_model_dir)
    base = {name: value for name, value in os.environ.items() if not name.startswith("TUNEFORGE_")}
    base.update({
        "TUNEFORGE_HOME": str(home), "TUNEFORGE_DATABASE_URL": database_url, "TUNEFORGE_HOST": "127.0.0.1",
        "TUNEFORGE_SCHEDULER_TICK_S": "0.2", "TUNEFORGE_HEARTBEAT_INTERVAL_S": "0.5",
        "TUNEFORGE_LEASE_TIMEOUT_S": str(LEASE_S), "TUNEFORGE_RETRY_BACKOFF_S": "0",
        "TUNEFORGE_LOCAL_GPUS": "2", "TOKENIZERS_PARALLELISM": "false",
        "TUNEFORGE_API_WORKERS": "1",  # /healthz answers from the process that schedules
        # no post-training eval (~7 s after the last step), as for every plane of tests/e2e
        # (conftest.start_plane): what it does is tests/e2e/test_eval_gates.py's
        "TUNEFORGE_EVAL_BY_DEFAULT": "false",
    })
    planes = []
    for name in ("first", "second"):
        port = free_port()
        planes.append(ServeProcess({**base, "TUNEFORGE_PORT": str(port)}, port, tmp_path / f"{name}.log"))
    leader, standby = planes
    try:
        leader.start()
        wait_until(lambda: _role(leader) == "leader", 20, "the first control plane to lead")
        standby.start()
        time.sleep(1.0)
        assert (_role(leader), _role(standby)) == ("leader", "standby")

        sdk = openai.OpenAI(base_url=f"{standby.url}/v1", api_key=key, max_retries=2,
                            http_client=httpx.Client(trust_env=False, timeout=30))
        files = write_demo_files(tmp_path / "data", n_keys=24)
        training = sdk.files.create(file=files.training_path.open("rb"), purpose="fine-tune")
        jobs = [sdk.fine_tuning.jobs.create(
            model="tiny-chat", training_file=training.id, seed=seed,
            method={"type": "supervised", "supervised": {"hyperparameters": HYPERPARAMETERS}},
            extra_body={"training_type": {"type": "lora", **DEMO_LORA}, "checkpointing": {"every_steps": 20}},
        ).id for seed in (1, 2)]

        def attempts(job_id):
            return httpx.get(f"{standby.url}/v1/fine_tuning/jobs/{job_id}/attempts", trust_env=False,
                             headers={"Authorization": f"Bearer {key}"}, timeout=30).json()["data"]

        def stepped(job_id):
            return any(e.type == "metrics" for e in sdk.fine_tuning.jobs.list_events(job_id, limit=5))

        wait_until(lambda: all(stepped(j) for j in jobs), 120, "both jobs to train")
        assert [len(attempts(j)) for j in jobs] == [1, 1]

        leader.kill()
        killed_at = time.monotonic()
        wait_until(lambda: _role(standby) == "leader", 15, "the standby to take over")
        took_over_s = time.monotonic() - killed_at

        def ended(job_id):
            return sdk.fine_tuning.jobs.retrieve(job_id).status in ("succeeded", "failed", "cancelled")

        wait_until(lambda: all(ended(j) for j in jobs), 180, "both jobs to end", interval_s=0.1)
        for job_id in jobs:
            done = sdk.fine_tuning.jobs.retrieve(job_id)
            assert done.status == "succeeded", done.error
            rows = attempts(job_id)
            # the orphaned attempt was declared lost once, then one new attempt finished the job
            assert [(a["number"], a["status"]) for a in rows] == [(1, "lost"), (2, "succeeded")]
            assert rows[0]["ended_at"] <= rows[1]["started_at"]  # never two live attempts
            assert rows[0]["failure_class"] == "platform"
        assert took_over_s < 10, f"took {took_over_s:.1f} s"
    finally:
        for plane in planes:
            plane.stop()
        for pid in trainer_pids(home):
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
