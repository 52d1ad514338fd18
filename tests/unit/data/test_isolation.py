"""Work on tenant data in a worker process with a deadline."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tuneforge.data import isolation
from tuneforge.data.pipeline import CheckOptions
from tuneforge.services.datasets import checks as datasets


def test_the_answer_comes_from_another_process_and_the_worker_is_reused() -> None:
    first = isolation.call_isolated("os:getpid", (), 30)
    assert first != os.getpid()
    assert isolation.call_isolated("os:getpid", (), 30) == first
    assert isolation.idle_workers() >= 1


def test_an_exception_is_raised_here_and_the_worker_survives_it() -> None:
    with pytest.raises(json.JSONDecodeError):
        isolation.call_isolated("json:loads", ("{",), 30)
    assert isolation.call_isolated("json:loads", ('{"a": 1}',), 30) == {"a": 1}


def test_past_the_deadline_the_worker_is_killed_and_the_caller_told() -> None:
    pid = isolation.call_isolated("os:getpid", (), 30)
    with pytest.raises(isolation.DeadlineExceeded) as caught:
        # the idle worker takes it (last in, first out), so its pid is the one killed
        isolation.call_isolated("time:sleep", (60,), 0.3)
    assert caught.value.deadline_s == 0.3
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert isolation.call_isolated("os:getpid", (), 30) != pid  # a fresh worker answers next


def test_the_deadline_counts_from_before_the_request_even_if_the_caller_waits_for_the_cpu(monkeypatch) -> None:
    """On a busy host the caller may lose the CPU right after sending the request; an answer
    that came in after the deadline is refused all the same."""
    isolation.call_isolated("os:getpid", (), 30)  # a warm worker, so the answer comes at once
    write = isolation._write

    def write_then_lose_the_cpu(stream, payload):  # noqa: ANN001
        write(stream, payload)
        time.sleep(0.5)  # the worker answers meanwhile

    monkeypatch.setattr(isolation, "_write", write_then_lose_the_cpu)
    with pytest.raises(isolation.DeadlineExceeded):
        isolation.call_isolated("os:getpid", (), 0.2)


def test_a_worker_that_dies_is_reported(tmp_path: Path) -> None:
    with pytest.raises(isolation.WorkerDied):
        isolation.call_isolated("os:_exit", (3,), 30)


def test_a_check_past_its_deadline_fails_the_file_with_a_stable_error(tmp_path: Path) -> None:
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps({"text": f"line {n}"}) + "\n" for n in range(20_000)))
    report = datasets.check_in_worker(path, CheckOptions(method=None, min_examples=1), "train.jsonl",
                                      deadline_s=0.001)
    assert not report.ok
    [code] = report.errors.counts
    assert code == "check_timeout"
    message = report.errors.samples[code][0]["message"]
    assert "train.jsonl" in message and "took longer than" in message and str(tmp_path) not in message


def test_a_check_within_its_deadline_is_the_check() -> None:
    assert datasets.check_deadline_s(0) == datasets.CHECK_DEADLINE_BASE_S
    assert datasets.check_deadline_s(10 * datasets.CHECK_MIN_BYTES_PER_S) == datasets.CHECK_DEADLINE_BASE_S + 10


def test_a_killed_worker_leaves_no_temporary_files() -> None:
    scratch = isolation.call_isolated("tempfile:mkdtemp", (), 30)  # inside the worker's own folder
    assert os.path.isdir(scratch)
    with pytest.raises(isolation.DeadlineExceeded):
        isolation.call_isolated("time:sleep", (60,), 0.3)  # the same worker, killed
    assert not os.path.exists(scratch)


def test_memory_past_the_cap_fails_in_the_worker_not_the_host() -> None:
    with pytest.raises(MemoryError):
        isolation.call_isolated("builtins:bytearray", (isolation.WORKER_MEMORY_BYTES + 2**30,), 30)
    assert isolation.call_isolated("builtins:len", ("still here",), 30) == 10


def test_a_warm_worker_removes_its_scratch_folder_when_its_caller_exits(tmp_path: Path) -> None:
    import subprocess
    import sys
    import time

    # a caller that leaves a warm worker behind and exits: the worker sees its pipe close
    script = ("import tempfile; from tuneforge.data import isolation; "
              "print(isolation.call_isolated('tempfile:gettempdir', (), 30))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    scratch = Path(done.stdout.strip())
    assert scratch.name.startswith("tuneforge-isolated-")
    deadline = time.monotonic() + 30
    while scratch.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not scratch.exists()
