"""`python -m tuneforge.train SPEC.json` as a real process against a fake control plane."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import tuneforge
from tests.helpers.fake_control_plane import FakeControlPlane
from tests.helpers.tiny import stage_job
from tuneforge.domain.exit_codes import TrainerExit
from tuneforge.storage import layout
from tuneforge.train import checkpoint as ckpt

SRC_DIR = Path(tuneforge.__file__).resolve().parents[1]
TIMEOUT_S = 120


def _start(spec_path: Path) -> subprocess.Popen:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC_DIR), env.get("PYTHONPATH")]))
    return subprocess.Popen(
        [sys.executable, "-m", "tuneforge.train", str(spec_path)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def _finish(process: subprocess.Popen) -> tuple[int, str]:
    _, stderr = process.communicate(timeout=TIMEOUT_S)
    return process.returncode, stderr


def test_successful_attempt_reports_everything_and_exits_0(tmp_path: Path, tiny_model_dir: Path) -> None:
    with FakeControlPlane() as plane:
        spec, _ = stage_job(tmp_path, tiny_model_dir, callback_url=plane.url)
        spec.write(tmp_path / "spec.json")
        code, stderr = _finish(_start(tmp_path / "spec.json"))
    assert code == TrainerExit.SUCCESS, stderr[-3000:]

    assert plane.accepted("heartbeat"), "no heartbeat arrived"
    metrics = [e["data"] for e in plane.accepted_events() if e["type"] == "metrics"]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4, 5, 6]
    result = plane.accepted("result")
    assert len(result) == 1 and result[0]["attempt"] == 1
    assert result[0]["adapter_prefix"] == layout.artifact_prefix(spec.tenant_id, spec.job_id, "adapter")
    seqs = [e["seq"] for e in plane.accepted_events()] + [result[0]["seq"]]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert all(r.authorization == "Bearer job-token-1" for r in plane.received)


def test_stale_attempt_409_exits_fenced(tmp_path: Path, tiny_model_dir: Path) -> None:
    stale = {"error": {"message": "attempt 1 is not current", "code": "stale_attempt"}}
    with FakeControlPlane(answer=lambda kind, body: (409, stale)) as plane:
        spec, store = stage_job(tmp_path, tiny_model_dir, callback_url=plane.url)
        spec.write(tmp_path / "spec.json")
        code, stderr = _finish(_start(tmp_path / "spec.json"))
    assert code == TrainerExit.FENCED, stderr[-3000:]
    assert store.list(layout.job_prefix(spec.tenant_id, spec.job_id)) == []


def test_sigterm_finishes_the_step_checkpoints_and_exits_preempted(tmp_path: Path, tiny_model_dir: Path) -> None:
    with FakeControlPlane() as plane:
        spec, store = stage_job(
            tmp_path, tiny_model_dir, callback_url=plane.url, hyperparameters={"n_epochs": 200}
        )
        spec.write(tmp_path / "spec.json")
        process = _start(tmp_path / "spec.json")
        deadline = time.monotonic() + TIMEOUT_S
        while not any(e["type"] == "metrics" for e in plane.accepted_events()):
            assert process.poll() is None and time.monotonic() < deadline, "no step was reported"
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        code, stderr = _finish(process)
    assert code == TrainerExit.PREEMPTED, stderr[-3000:]
    found = ckpt.latest_valid_checkpoint(store, layout.checkpoints_prefix(spec.tenant_id, spec.job_id))
    assert found is not None and 1 <= found.step < 600
    assert [c["step"] for c in plane.accepted("checkpoints")] == [found.step]
    stopped = [e for e in plane.accepted_events() if e["type"] == "message" and e["level"] == "warn"]
    assert stopped[-1]["data"] == {"step": found.step, "reason": "preempted"}
    assert not plane.accepted("result")
