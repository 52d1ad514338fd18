"""Tenant python graders, run only inside a bubblewrap sandbox: never in the platform's process.

One sandbox is one process tree: `bwrap` (as an unprivileged uid of its own when the platform runs
as root) starting the OS's python on `sandbox_child.py`, which loads the tenant's source and
answers requests as JSON lines on its stdin and stdout (`sandbox_process.py` builds and drives it,
`sandbox_seccomp.py` is its system-call filter). The sandbox has its own namespaces (no network,
its own pids, no view of the host's files but /usr read-only, a small tmpfs as /tmp, its own /proc
and /dev), an allow-listed environment, no capabilities, a seccomp filter, and rlimits on CPU
time, address space, file size, open files, processes and core dumps. The parent bounds what it
reads, kills a sample's process tree when it overruns its wall time, and never blocks without a
deadline. Where the host cannot sandbox, `available()` says why and python graders are refused.

A score is what `grade` returns when it is an int or a float (a bool counts, as Python's ints do:
True is 1.0), finite; anything else, NaN and infinities included, is `non_number`.

Limits are rlimits because cgroups are not writable here: memory is bounded per process
(RLIMIT_AS), so a grader using every allowed process may hold `processes x memory_bytes`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import platform
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tuneforge.graders import sandbox_seccomp
from tuneforge.graders.sandbox_process import BWRAP, Broken, Running, launch

log = logging.getLogger(__name__)

ERRORS = ("syntax_error", "runtime_error", "timeout", "non_number", "memory_error", "output_too_large", "sandbox_error")
CHILD_ERRORS = ("syntax_error", "runtime_error", "non_number", "memory_error")  # what a child may answer
DEFAULT_PYTHON = "/usr/bin/python3"
STARTUP_TIMEOUT_S = 10.0  # bwrap and the interpreter starting, on a busy host
DETAILS_CHARS = 500
UNAVAILABLE = "python graders are not available on this server: "
RECHECK_UNAVAILABLE_S = 60.0  # a failed probe is retried after this (the operator may install bubblewrap)


@dataclass(frozen=True)
class SandboxLimits:
    cpu_time_s: int = 10  # RLIMIT_CPU of the sandbox process (all samples of a batch)
    wall_time_s: float = 5.0  # per sample: no answer within it -> that sample times out
    memory_bytes: int = 512 << 20  # RLIMIT_AS, per process of the sandbox
    processes: int = 16  # RLIMIT_NPROC, bwrap and the interpreter included
    output_bytes: int = 64 << 10  # largest answer line read for one sample
    scratch_bytes: int = 16 << 20  # tmpfs size and RLIMIT_FSIZE
    source_bytes: int = 256 << 10


@dataclass(frozen=True)
class PythonOutcome:
    score: float | None  # None when error is set
    error: str | None  # one of ERRORS, or None
    details: str | None  # tenant-safe: exception type + message, <= 500 chars, no host paths
    execution_time_s: float


def _details(text: Any) -> str | None:
    if not isinstance(text, str):
        return None
    return "".join(char if char.isprintable() else " " for char in text[:DETAILS_CHARS])


def _encode(message: Mapping[str, Any]) -> bytes:
    # ASCII (escapes for the rest, lone surrogates included); NaN passes: a dataset line may hold one
    return (json.dumps(message) + "\n").encode("ascii")


def _finite(value: Any) -> float | None:
    """A number the child sent (an int or float, not a bool: the child already made those 1.0 or
    0.0) as a finite float; None for anything else, whatever a forged line holds."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int past float's range
        return None
    return number if math.isfinite(number) else None


def _outcome(error: str, details: str, elapsed_s: float) -> PythonOutcome:
    return PythonOutcome(score=None, error=error, details=details, execution_time_s=elapsed_s)


class PythonSandbox:
    """A tenant's python grader, loaded once in a sandbox process that grades many samples.

    Not thread-safe: one thread uses it at a time. bwrap dies with the thread that started it
    (--die-with-parent follows the parent thread), so that thread must outlive the sandbox.
    """

    def __init__(self, source: str, *, limits: SandboxLimits = SandboxLimits(),
                 python: str = DEFAULT_PYTHON) -> None:
        self._source = source
        self._limits = limits
        self._python = python
        self._running: Running | None = None
        self._finalizer: weakref.finalize | None = None
        self._source_failure: PythonOutcome | None = None  # the source itself does not load
        self._loaded_once = False
        self._cpu_used_s = 0.0
        self._request_id = 0

    def __enter__(self) -> PythonSandbox:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Kills the sandbox's processes; a later call starts a new one."""
        if self._finalizer is not None:
            self._finalizer()  # runs Running.stop once
        self._running = None
        self._finalizer = None

    def check(self) -> PythonOutcome | None:
        """Compile the source and find `grade` inside the sandbox; an outcome with
        error="syntax_error" (details: line and message) or "runtime_error" (no callable
        `grade`, import-time exception), None when fine."""
        if self._source_failure is None and self._running is None:
            failure = self._start()
            if failure is not None and failure.error != "sandbox_error" and not self._loaded_once:
                self._source_failure = failure
            return failure
        return self._source_failure

    def grade_many(self, calls: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]]) -> list[PythonOutcome]:
        """Grade each (sample, item) in one sandbox process, in order. After a sample that times
        out or ends the process, a fresh sandbox carries on with the next one; restarts stop
        (the rest time out) once the batch has run len(calls) * wall_time_s."""
        if not calls:
            return []
        failure = self.check()
        if failure is not None:
            return [failure] * len(calls)
        budget_ends = time.monotonic() + len(calls) * self._limits.wall_time_s
        outcomes: list[PythonOutcome] = []
        restarts = 0
        for index, (sample, item) in enumerate(calls):
            if self._running is None or self._cpu_nearly_spent():
                self.close()
                if restarts >= len(calls) or time.monotonic() > budget_ends:
                    spent = _outcome("timeout", "the batch's time limit was reached before this sample ran", 0.0)
                    outcomes += [spent] * (len(calls) - index)
                    break
                restarts += 1
                failure = self._start()
                if failure is not None and failure.error == "sandbox_error":
                    outcomes += [failure] * (len(calls) - index)
                    break
                if failure is not None:  # the source loaded before; it failed this time
                    outcomes.append(failure)
                    continue
            outcomes.append(self._call(sample, item))
        return outcomes

    def _cpu_nearly_spent(self) -> bool:
        # A fresh process before the CPU limit (the whole process's) can end this one in the middle
        # of a sample that is not to blame: once less than a sample's wall time is left (or half
        # the limit, when the limit is the smaller), the next sample starts afresh.
        margin_s = min(self._limits.wall_time_s, self._limits.cpu_time_s / 2)
        return self._cpu_used_s > self._limits.cpu_time_s - margin_s

    def _start(self) -> PythonOutcome | None:
        """Starts a sandbox and loads the source: None when `grade` is ready, else why not."""
        started = time.monotonic()
        if len(self._source.encode("utf-8", "surrogatepass")) > self._limits.source_bytes:
            return _outcome("syntax_error", f"the source is over {self._limits.source_bytes} bytes", 0.0)
        try:
            running = launch(self._python, cpu_time_s=self._limits.cpu_time_s,
                             memory_bytes=self._limits.memory_bytes, scratch_bytes=self._limits.scratch_bytes,
                             processes=self._limits.processes, output_bytes=self._limits.output_bytes)
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("grader sandbox did not start: %s", exc)
            return _outcome("sandbox_error", "the grader sandbox could not start", time.monotonic() - started)
        self._running, self._finalizer = running, weakref.finalize(self, running.stop)
        self._cpu_used_s = 0.0
        try:
            hello = running.receive(started + STARTUP_TIMEOUT_S)
        except Broken as broken:
            hello = {"broken": broken.reason}
        if hello != {"hello": 1}:
            log.warning("grader sandbox did not start (%s): %s", hello, running.stderr_head() or "no message")
            self.close()
            return _outcome("sandbox_error", "the grader sandbox could not start", time.monotonic() - started)
        loading = time.monotonic()
        try:
            running.send(_encode({"source": self._source}), loading + self._limits.wall_time_s)
            answer = running.receive(loading + self._limits.wall_time_s)
        except Broken as broken:
            return self._broken(broken, time.monotonic() - loading)
        if answer.get("loaded") is True:
            self._loaded_once = True
            return None
        self.close()
        return self._child_error(answer, time.monotonic() - loading)

    def _call(self, sample: Mapping[str, Any], item: Mapping[str, Any]) -> PythonOutcome:
        assert self._running is not None
        self._request_id += 1
        try:
            line = _encode({"id": self._request_id, "sample": sample, "item": item})
        except (TypeError, ValueError) as exc:  # the platform's data, not the tenant's code
            log.warning("a python grader's sample is not JSON: %s", exc)
            return _outcome("sandbox_error", "the sample could not be sent to the grader", 0.0)
        started = time.monotonic()
        deadline = started + self._limits.wall_time_s
        try:
            self._running.send(line, deadline)
            answer = self._running.receive(deadline)
            while answer.get("id") != self._request_id:  # a stale line (the tenant wrote it) is skipped
                answer = self._running.receive(deadline)
        except Broken as broken:
            return self._broken(broken, time.monotonic() - started)
        elapsed_s = time.monotonic() - started
        cpu_s = _finite(answer.get("cpu_s"))
        if cpu_s is not None:
            self._cpu_used_s = cpu_s
        if "error" in answer:
            return self._child_error(answer, elapsed_s)
        score = _finite(answer.get("score"))
        if score is None:
            return _outcome("non_number", "grade returned something that is not a finite number", elapsed_s)
        return PythonOutcome(score=score, error=None, details=None, execution_time_s=elapsed_s)

    def _child_error(self, answer: Mapping[str, Any], elapsed_s: float) -> PythonOutcome:
        error = answer.get("error")
        if error not in CHILD_ERRORS:  # only what the child reports; never the platform's own errors
            return _outcome("runtime_error", "the grader's process answered out of protocol", elapsed_s)
        return _outcome(str(error), _details(answer.get("details")) or str(error), elapsed_s)

    def _broken(self, broken: Broken, elapsed_s: float) -> PythonOutcome:
        """The outcome of a sample (or a load) whose process can no longer be used; kills it."""
        assert self._running is not None
        status = self._running.exit_status() if broken.reason == "ended" else None
        self.close()
        if broken.reason == "timeout":
            return _outcome("timeout", f"the grader did not answer within {self._limits.wall_time_s:g} s", elapsed_s)
        if broken.reason == "too_large":
            return _outcome("output_too_large", f"the grader's answer was over {self._limits.output_bytes} bytes",
                            elapsed_s)
        if broken.reason == "garbled":
            return _outcome("runtime_error", "the grader's process answered out of protocol", elapsed_s)
        # bwrap exits with 128 + the signal that ended its child; the interpreter, its namespace's
        # init, is immune to signals from inside the sandbox: a SIGKILL came from the kernel, at
        # the CPU time limit
        if status == 128 + signal.SIGKILL:
            return _outcome("timeout", f"the grader's CPU time limit ({self._limits.cpu_time_s} s) was reached",
                            elapsed_s)
        return _outcome("runtime_error", f"the grader's process ended before answering (exit status {status})",
                        elapsed_s)


PROBE_SOURCE = "def grade(sample, item):\n    return 1\n"
_availability: dict[str, tuple[str | None, float]] = {}
_availability_lock = threading.Lock()


def available(python: str = DEFAULT_PYTHON) -> str | None:
    """None when python graders can run here; otherwise why not (tenant-safe sentence).
    Actually starts a trivial sandbox once (cached) to find out."""
    with _availability_lock:
        cached = _availability.get(python)
        if cached is not None and (cached[0] is None or time.monotonic() - cached[1] < RECHECK_UNAVAILABLE_S):
            return cached[0]
        reason = _probe(python)
        _availability[python] = (reason, time.monotonic())
        return reason


def _probe(python: str) -> str | None:
    if not sys.platform.startswith("linux") or not os.access(BWRAP, os.X_OK):
        return UNAVAILABLE + "its sandbox (bubblewrap) is not installed"
    if platform.machine() not in sandbox_seccomp.MACHINES:
        return UNAVAILABLE + "its sandbox has no system-call filter for this CPU architecture"
    resolved = os.path.realpath(python)
    if not (python.startswith("/usr/") and resolved.startswith("/usr/") and os.access(resolved, os.X_OK)):
        # the sandbox holds /usr only: an interpreter elsewhere (or the platform's own) is not there
        return UNAVAILABLE + "the graders' interpreter (the system's python, under /usr) is missing"
    with PythonSandbox(PROBE_SOURCE, python=python) as probe:
        (outcome,) = probe.grade_many([({}, {})])
    if outcome.score != 1.0:
        log.warning("the grader sandbox probe failed: %s (%s)", outcome.error, outcome.details)
        return UNAVAILABLE + "its sandbox could not start"
    return None
