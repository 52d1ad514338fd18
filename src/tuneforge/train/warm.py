"""`python -m tuneforge.train.warm`: a trainer kept warm, forked for each attempt.

A trainer spends most of a small job's start importing torch, transformers and
peft (5-10 s of CPU on a small host), the same modules every time. The local
executor keeps one process that has imported them and nothing else, and asks it
for each attempt: it forks, and the child becomes that attempt's trainer
(`tuneforge.train.__main__.main`) in a session of its own, with the attempt's
environment, working folder and log, as a fresh `python -m tuneforge.train`
would have them. Nothing of a job ever runs in this process itself.

What makes the fork safe: this process runs no Python threads and has done no
work but imports (no tensor op ran, so no thread pool exists to be lost; CUDA
is never initialised here, and it refuses to serve if an import did); it starts
from the allow-listed environment a trainer gets (security/env.py), so a child
inherits nothing a cold trainer would not; the children seed everything they
draw, as every attempt does.

Protocol (stdin/stdout, one JSON object a line): it first writes
{"ready": true} (or {"ready": false, "error": ...}) once the imports are done;
then for each request {"spec": path, "env": {...}, "cwd": path, "log": path} and
optionally "watch": PID, it answers {"pid": N, "started": T} (T: `process_start_time`)
once the child has its own session (so its process group can be signalled at once),
or {"error": ...}. With "watch", the child's process group is killed when that process
ends (a Ray node's TrainerHost: a trainer never outlives the actor that owns it, as a
trainer it starts itself dies with it by the parent-death signal); it is refused where
the kernel has no pidfd (Linux < 5.3), and the caller starts the trainer itself. A child that a signal ended leaves
its exit code beside its spec, as a trainer that ends by itself does
(`__main__.exit_file`), so the executor tells a cancelled attempt from a lost
one. When stdin closes (the control plane went) it exits; the children run on
in their own sessions.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
import threading
from select import select as wait_readable
from typing import Any, NoReturn

from tuneforge.train.__main__ import exit_file, run_forked, write_exit_file

# What every trainer imports before its first step; an architecture's own modeling module is
# imported by the child (transformers loads it lazily by name).
PRELOADED = (
    "torch",
    "transformers",
    "transformers.modeling_utils",
    "transformers.models.auto.modeling_auto",
    "transformers.models.auto.tokenization_auto",
    "peft",
    "tuneforge.train.__main__",
    "tuneforge.train.distributed",
    "tuneforge.train.reporter",
    "tuneforge.train.runner",
)
REAP_INTERVAL_S = 0.5


def preload() -> None:
    # the defaults the trainer's own start-up sets, before the libraries read them at import
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    for name in PRELOADED:
        importlib.import_module(name)
    import torch

    if torch.cuda.is_initialized():
        raise RuntimeError("CUDA was initialised while importing: a forked trainer could not use it")
    if threading.active_count() != 1:
        raise RuntimeError("a Python thread was started while importing: forking is not safe")


def _reply(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def process_start_time(pid: int) -> str | None:
    """When the process started (clock ticks after boot, /proc/PID/stat): with its pid, the
    process itself, whatever later process gets that pid. None: no such process."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            stat = handle.read()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()  # the name, in parentheses, may hold spaces
    return fields[19] if len(fields) > 19 else None


def _die_with(watched_fd: int) -> None:
    """Kill this process's group once the process behind the pidfd `watched_fd` has ended."""

    def watch() -> None:
        wait_readable([watched_fd], [], [])  # readable once that process has exited
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch, name="tuneforge-owner-watch", daemon=True).start()


def _child(request: dict[str, Any], started_fd: int, watched_fd: int | None) -> NoReturn:
    """In the forked child: become the attempt's trainer, then exit with its code."""

    def prepare() -> None:
        os.setsid()
        if watched_fd is not None:
            _die_with(watched_fd)
        os.write(started_fd, b"s")  # its session exists: the executor may signal its group now
        os.close(started_fd)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        log_fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        null_fd = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null_fd, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
        os.close(null_fd)
        os.chdir(request["cwd"])

    run_forked(request["spec"], {str(name): str(value) for name, value in request["env"].items()}, prepare)


def _launch(request: dict[str, Any], children: dict[int, str]) -> dict[str, Any]:
    for field in ("spec", "cwd", "log"):
        if not isinstance(request.get(field), str):
            return {"error": f"{field} must be a path"}
    if not isinstance(request.get("env"), dict):
        return {"error": "env must be an object"}
    watched_fd = None
    if request.get("watch") is not None:
        watched = request["watch"]
        if isinstance(watched, bool) or not isinstance(watched, int) or watched <= 0:
            return {"error": "watch must be a process id"}
        try:
            watched_fd = os.pidfd_open(watched)  # held from now: a pid reused later is not it
        except ProcessLookupError:
            return {"error": f"the process to watch ({watched}) has ended"}
        except (AttributeError, OSError) as exc:
            return {"error": f"cannot watch a process here ({type(exc).__name__})"}
    try:
        return _fork(request, children, watched_fd)
    finally:
        if watched_fd is not None:
            os.close(watched_fd)


def _fork(request: dict[str, Any], children: dict[int, str], watched_fd: int | None) -> dict[str, Any]:
    # SIGTERM stays blocked from before the fork until the trainer's own handler is in place
    # (`__main__.main` unblocks it): a notice sent while the child starts is not lost
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    started_read, started_write = os.pipe()
    try:
        pid = os.fork()
        if pid == 0:
            os.close(started_read)
            _child(request, started_write, watched_fd)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    os.close(started_write)
    try:
        os.read(started_read, 1)  # the child has its own session (or is gone: end of file)
    finally:
        os.close(started_read)
    children[pid] = request["spec"]
    # read before this process reaps it: until then the child is there, if only as a zombie
    return {"pid": pid, "started": process_start_time(pid)}


def _reap(children: dict[int, str]) -> None:
    """Collect ended children; one a signal ended gets its exit code file (-signal, as
    subprocess reports it) before it is reaped, so no moment exists without either."""
    while children:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None or info.si_pid == 0:
            return
        spec = children.pop(info.si_pid, None)
        if spec is not None and info.si_code in (os.CLD_KILLED, os.CLD_DUMPED) and not os.path.exists(exit_file(spec)):
            write_exit_file(spec, -info.si_status)  # as the trainer does for itself (a failure is logged)
        os.waitpid(info.si_pid, 0)


def serve() -> int:
    try:
        preload()
    except Exception as exc:  # noqa: BLE001 - told to the executor, which starts trainers cold
        _reply({"ready": False, "error": f"{type(exc).__name__}: {exc}"})
        return 1
    _reply({"ready": True})
    children: dict[int, str] = {}
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C at the control plane's terminal is its own
    stdin = sys.stdin.buffer
    while True:
        readable, _, _ = wait_readable([stdin], [], [], REAP_INTERVAL_S)
        _reap(children)
        if not readable:
            continue
        line = stdin.readline()
        if not line:
            return 0  # the control plane went; the children run on in their own sessions
        try:
            request = json.loads(line)
            reply = _launch(request, children) if isinstance(request, dict) else {"error": "not an object"}
        except (ValueError, OSError) as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        _reply(reply)


if __name__ == "__main__":
    sys.exit(serve())
