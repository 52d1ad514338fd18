"""Trainers forked from a warm process (executors/warm.py, train/warm.py): each is its own
session with its own log and exit code, a signal reaches it as it reaches a cold trainer, and
the warm process holds nothing of the control plane's environment.

A spec path that is a FIFO keeps a trainer waiting at its first read (`JobSpec.read`) for as long
as a test needs it alive; writing garbage into the FIFO then ends it with a platform error."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tuneforge.domain.exit_codes import TrainerExit
from tuneforge.executors.local import LocalExecutor
from tuneforge.executors.warm import WarmTrainer
from tuneforge.security.env import child_env
from tuneforge.settings import Settings
from tuneforge.train.warm import process_start_time

READY_TIMEOUT_S = 180
PLANTED = "planted-admin-key-1b6f"


def _wait(predicate, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _exit_code(spec: Path) -> str:
    exit_path = spec.with_suffix(".exit")
    _wait(exit_path.exists)
    return exit_path.read_text().strip()


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _release(fifo: Path) -> None:
    """Give the trainer waiting on `fifo` an unreadable spec: it ends with a platform error."""
    deadline = time.monotonic() + 60
    while True:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO while no reader has it open
            break
        except OSError:
            assert time.monotonic() < deadline, "no trainer is reading its spec"
            time.sleep(0.02)
    os.write(fd, b"not a spec")
    os.close(fd)


@pytest.fixture(scope="module")
def warm(tmp_path_factory) -> WarmTrainer:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TUNEFORGE_ADMIN_API_KEY", PLANTED)  # the control plane's: never a trainer's
        env = child_env({"TOKENIZERS_PARALLELISM": "false"})
    trainer = WarmTrainer(env, tmp_path_factory.mktemp("warm") / "warm.log")
    trainer.start()
    _wait(trainer.ready, READY_TIMEOUT_S)
    yield trainer
    trainer.close()


def _launch(warm: WarmTrainer, tmp_path: Path, spec: Path) -> tuple[int, str]:
    forked = warm.launch(str(spec), child_env({"TUNEFORGE_NODE": "local"}), str(tmp_path), str(tmp_path / "log"))
    assert forked is not None, "the warm trainer did not fork"
    return forked


def test_each_attempt_is_a_child_of_one_warm_process_with_its_own_log_and_exit_code(warm, tmp_path):
    warm_pid = warm.pid
    assert PLANTED not in Path(f"/proc/{warm_pid}/environ").read_bytes().decode(errors="replace")
    for number in (1, 2):
        spec = tmp_path / f"ftjob-w-attempt-{number}.json"  # absent: the trainer cannot read it
        pid, _started = _launch(warm, tmp_path, spec)
        assert pid != warm_pid
        assert _exit_code(spec) == str(int(TrainerExit.PLATFORM_ERROR))
    assert warm.pid == warm_pid, "the warm process was started again"
    log = (tmp_path / "log").read_text()
    assert log.count("cannot read the job spec") == 2, log[-2000:]


def test_the_executor_follows_and_cancels_a_warm_trainer(warm, tmp_path, monkeypatch):
    executor = LocalExecutor(Settings(home=tmp_path / "home"))
    monkeypatch.setattr(executor, "_warm", warm)
    spec = _fifo(tmp_path / "ftjob-k-attempt-1.json")
    pid, started = _launch(warm, tmp_path, spec)
    handle = {"pid": pid, "started": started, "warm": True, "spec_path": str(spec)}
    try:
        assert os.getpgid(pid) == pid, "a trainer runs in a session of its own"
        assert executor.poll(handle).state == "running"
        # the same pid with another start time is another process
        assert executor.poll({**handle, "started": str(int(started) + 1)}).state == "unknown"
    except BaseException:
        os.kill(pid, signal.SIGKILL)  # it waits on its FIFO for ever otherwise
        raise
    executor.signal(handle, "cancel")  # SIGKILL to its process group
    _wait(lambda: executor.poll(handle).state == "exited")
    assert executor.poll(handle).exit_code == -signal.SIGKILL  # the warm process wrote it


def test_a_sigterm_sent_at_once_is_a_notice_not_a_kill(warm, tmp_path):
    spec = _fifo(tmp_path / "ftjob-t-attempt-1.json")
    pid, _started = _launch(warm, tmp_path, spec)
    os.kill(pid, signal.SIGTERM)  # before or after its handler is in place: either way a notice
    _release(spec)
    assert _exit_code(spec) == str(int(TrainerExit.PLATFORM_ERROR))  # not -SIGTERM



def test_a_trainer_told_to_watch_its_owner_dies_with_it_and_a_gone_owner_is_refused(warm, tmp_path):
    owner = subprocess.Popen(["sleep", "600"])  # a Ray node's TrainerHost, which owns the trainer
    spec = _fifo(tmp_path / "ftjob-o-attempt-1.json")
    forked = warm.launch(str(spec), child_env(), str(tmp_path), str(tmp_path / "log"), watch=owner.pid)
    assert forked is not None, "the warm trainer did not fork"
    pid, started = forked
    try:
        time.sleep(0.5)
        assert process_start_time(pid) == started, "it runs while its owner does"
    finally:
        owner.kill()
        owner.wait()
    _wait(lambda: process_start_time(pid) != started, 30)  # its group was killed
    assert _exit_code(spec) == str(-signal.SIGKILL)
    # an owner already gone: nothing is forked (the caller starts the trainer itself)
    assert warm.launch(str(tmp_path / "ftjob-o-attempt-2.json"), child_env(), str(tmp_path),
                       str(tmp_path / "log"), watch=owner.pid) is None
    assert warm.ready(), "a refused request leaves the warm trainer serving"

def test_an_executor_starts_cold_until_the_warm_process_is_ready_and_when_told_to(tmp_path):
    settings = Settings(home=tmp_path / "home", trainer_warm_start=False)
    assert LocalExecutor(settings)._warm is None
    trainer = WarmTrainer(child_env(), tmp_path / "warm.log")
    try:
        assert trainer.launch(str(tmp_path / "spec.json"), {}, str(tmp_path), str(tmp_path / "log")) is None
        assert trainer.pid is not None, "the first launch starts it, in the background"
    finally:
        trainer.close()


def test_an_executor_made_ready_starts_its_warm_trainer_before_any_launch(tmp_path):
    trainer = WarmTrainer(child_env(), tmp_path / "warm.log")
    executor = LocalExecutor(Settings(home=tmp_path / "home", trainer_warm_start=False))
    executor._warm = trainer  # this test's own warm trainer, not the process's shared one
    try:
        executor.prepare()
        first = trainer.pid
        assert first is not None, "prepare starts it, in the background"
        executor.prepare()
        assert trainer.pid == first  # already running: not started again
    finally:
        trainer.close()
    assert LocalExecutor(Settings(home=tmp_path / "cold", trainer_warm_start=False)).prepare() is None  # none to start
    # no slot, no attempt ever: nothing is kept warm
    assert LocalExecutor(Settings(home=tmp_path / "slotless", local_gpus=0))._warm is None
    assert LocalExecutor(Settings(home=tmp_path / "slots", local_gpus=1))._warm is not None
