"""CPU-heavy work on tenant data, run in a worker process under a deadline.

An upload's check (parsing, shapes, PII, duplicates) is CPU work on bytes a
tenant chose. Run in an API worker it holds the GIL, slows every other request
of that process, and a pathological file can hold it long enough for the
server to kill the whole worker, cutting every tenant's in-flight requests. So
`call_isolated` runs a function in a separate interpreter and waits at most
`deadline_s` for its answer: past the deadline the worker's process group is
killed (it may have started its own helpers, see `data.parallel`), its scratch
folder removed, and `DeadlineExceeded` is raised for the caller to turn into
the file's error. The API process only waits; its event loop and other threads run on.

Workers are fresh interpreters (`python -m tuneforge.data.isolation`, not
forked from a threaded server) kept warm between calls, at most
`MAX_IDLE_WORKERS` of them, so a check pays the start-up once per API process,
not once per upload. They talk over stdin/stdout with length-prefixed pickles;
the caller's requests are this platform's own (a dotted function name and its
arguments), never a tenant's. A worker also arms an alarm of its own for
each call, so it ends even when the process that asked has died.
"""

from __future__ import annotations

import importlib
import math
import os
import pickle
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from select import select as wait_readable
from typing import IO, Any

from tuneforge.security.env import child_env

MAX_IDLE_WORKERS = 2  # warm workers kept per process; busier moments start more, which end after the call
WORKER_SELF_DEADLINE_GRACE_S = 30  # a worker ends itself this long after a call's deadline, parent or not
_HEADER = struct.Struct("<Q")
_SCRATCH_PREFIX = "tuneforge-isolated-"
_MAX_ANSWER_BYTES = 256 * 1024 * 1024  # a report is kilobytes; more means a broken worker
# Writable memory a worker may map (RLIMIT_DATA: heap and anonymous mappings, not reserved
# address space). A reader whose file lies about its sizes meets MemoryError here, in the
# worker, instead of the host's OOM killer choosing a victim. A real check's peak is far lower
# (the dedup index of 20M rows is ~3 GiB).
WORKER_MEMORY_BYTES = 8 * 1024**3
_ANSWER_READ_GRACE_S = 60  # reading an answer whose header came in time (it is written in one go)


class DeadlineExceeded(Exception):
    """The call did not finish within its deadline; its worker was killed."""

    def __init__(self, deadline_s: float) -> None:
        super().__init__(f"the work did not finish within {deadline_s:g} s")
        self.deadline_s = deadline_s


class WorkerDied(Exception):
    """The worker ended without an answer (killed for memory, crashed)."""


class _Worker:
    def __init__(self) -> None:
        # its temporary files (an extracted archive) go to a folder of its own, removed with it,
        # so a worker killed mid-check leaves nothing behind
        self.scratch = tempfile.mkdtemp(prefix=_SCRATCH_PREFIX)
        env = child_env({"TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1", "TMPDIR": self.scratch})
        # its own session: a deadline kills the group, helpers included
        self.process = subprocess.Popen([sys.executable, "-m", "tuneforge.data.isolation"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, env=env, start_new_session=True)

    def call(self, target: str, args: tuple[Any, ...], kwargs: dict[str, Any], deadline_s: float,
             ) -> tuple[str, Any]:
        """("returned", value) or ("raised", exception)."""
        assert self.process.stdin is not None and self.process.stdout is not None
        request = (target, args, kwargs, deadline_s)
        # the deadline counts from before the request is sent: however long this thread waits for
        # the CPU after writing it, an answer that took longer than the deadline is never taken
        ends_at = time.monotonic() + deadline_s
        try:
            _write(self.process.stdin, pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL))
        except (BrokenPipeError, OSError) as exc:
            raise WorkerDied(f"the worker is gone ({exc})") from None
        header = _read_until(self.process.stdout, _HEADER.size, ends_at, deadline_s)
        (size,) = _HEADER.unpack(header)
        if size > _MAX_ANSWER_BYTES:
            raise WorkerDied(f"the worker answered {size} bytes")
        # the answer is written at once; only its header was waited for against the deadline
        return pickle.loads(_read_until(self.process.stdout, size, ends_at + _ANSWER_READ_GRACE_S, deadline_s))

    def kill(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()
        shutil.rmtree(self.scratch, ignore_errors=True)


_idle: list[_Worker] = []
_idle_lock = threading.Lock()


def call_isolated(target: str, args: tuple[Any, ...], deadline_s: float, **kwargs: Any) -> Any:
    """`target(*args, **kwargs)` (a `module:function` name) in a worker process, its answer or
    its exception; `DeadlineExceeded` after `deadline_s`, `WorkerDied` if the worker ended."""
    with _idle_lock:
        worker = _idle.pop() if _idle else None
    if worker is None or worker.process.poll() is not None:
        worker = _Worker()
    try:
        outcome, value = worker.call(target, args, kwargs, deadline_s)
    except BaseException:
        worker.kill()  # mid-answer or past its deadline: never reused
        raise
    with _idle_lock:
        if len(_idle) < MAX_IDLE_WORKERS:
            _idle.append(worker)
            worker = None
    if worker is not None:
        worker.kill()
    if outcome == "raised":
        raise value
    return value


def idle_workers() -> int:
    with _idle_lock:
        return sum(worker.process.poll() is None for worker in _idle)


def _write(stream: IO[bytes], payload: bytes) -> None:
    stream.write(_HEADER.pack(len(payload)) + payload)
    stream.flush()


def _read_until(stream: IO[bytes], size: int, ends_at: float, deadline_s: float) -> bytes:
    """Exactly `size` bytes from the pipe, waiting no later than `ends_at`."""
    descriptor = stream.fileno()
    chunks: list[bytes] = []
    remaining = size
    while remaining:
        wait_s = ends_at - time.monotonic()
        if wait_s <= 0 or not wait_readable([descriptor], [], [], wait_s)[0]:
            raise DeadlineExceeded(deadline_s)
        chunk = os.read(descriptor, min(remaining, 1 << 20))
        if not chunk:
            raise WorkerDied("the worker ended without an answer")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


# --- worker side ----------------------------------------------------------------


def _read_request(stream: IO[bytes]) -> tuple[str, tuple[Any, ...], dict[str, Any], float] | None:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None  # the parent closed the pipe: nothing more to do
    (size,) = _HEADER.unpack(header)
    return pickle.loads(stream.read(size))


def _resolve(target: str) -> Any:
    module_name, _, function_name = target.partition(":")
    return getattr(importlib.import_module(module_name), function_name)


def _limit_memory(limit_bytes: int) -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    cap = limit_bytes if hard == resource.RLIM_INFINITY else min(limit_bytes, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (cap, hard))


def _serve() -> None:
    _limit_memory(WORKER_MEMORY_BYTES)
    requests, answers = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # a stray print must not corrupt the answers
    while (request := _read_request(requests)) is not None:
        target, args, kwargs, deadline_s = request
        signal.alarm(math.ceil(deadline_s) + WORKER_SELF_DEADLINE_GRACE_S)
        try:
            answer = ("returned", _resolve(target)(*args, **kwargs))
        except Exception as exc:  # noqa: BLE001 - handed to the caller, which raises it
            answer = ("raised", exc)
        signal.alarm(0)
        try:
            payload = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # noqa: BLE001 - an exception that does not pickle
            payload = pickle.dumps(("raised", RuntimeError(f"{type(answer[1]).__name__}: {answer[1]}")))
        _write(answers, payload)
    # the parent closed the pipe (it exited, or died): the scratch folder it made goes with us
    scratch = os.environ.get("TMPDIR", "")
    if os.path.basename(scratch).startswith(_SCRATCH_PREFIX):
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    from tuneforge.data import isolation  # results pickle as tuneforge classes, not __main__ ones

    isolation._serve()
