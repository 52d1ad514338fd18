"""The local executor's view of trainers it did not launch, and the trainer's
exit-code file that makes that view exact."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tuneforge.domain.exit_codes import TrainerExit
from tuneforge.executors.local import LocalExecutor
from tuneforge.settings import Settings


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_an_adopted_trainer_that_left_its_exit_code_is_known_to_have_exited(tmp_path):
    executor = LocalExecutor(Settings(home=tmp_path / "home"))
    spec_path = executor.workdir / "ftjob-x-attempt-1.json"
    handle = {"pid": _dead_pid(), "spec_path": str(spec_path)}
    unknown = executor.poll(handle)  # SIGKILLed: no exit file, the code is unknown
    assert (unknown.state, unknown.exit_code) == ("unknown", None)
    spec_path.with_suffix(".exit").write_text("12\n")
    known = executor.poll(handle)
    assert (known.state, known.exit_code) == ("exited", TrainerExit.PREEMPTED)


def _catches_sigterm(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return bool(mask & (1 << (signal.SIGTERM - 1)))


def test_a_trainer_treats_sigterm_during_start_up_as_a_notice_and_leaves_its_exit_code(tmp_path):
    spec_path = tmp_path / "ftjob-y-attempt-1.json"  # never written: the trainer fails to read it
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-m", "tuneforge.train", str(spec_path)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not _catches_sigterm(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    assert proc.poll() is None, "the trainer ended before it installed its SIGTERM handler"
    proc.send_signal(signal.SIGTERM)  # a spot reclaim while it is still importing its libraries
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == TrainerExit.PLATFORM_ERROR, err.decode()[-2000:]  # not -SIGTERM
    assert spec_path.with_suffix(".exit").read_text().strip() == str(int(TrainerExit.PLATFORM_ERROR))
