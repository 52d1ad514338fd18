"""One python-grader sandbox process: how it is built (bubblewrap, rlimits, its uid, the seccomp
filter) and how the platform talks to it (bounded, deadline-bound reads and writes on its pipes).

The sandbox: new user, pid, network, ipc, uts and cgroup namespaces, no further user namespaces,
no capabilities, its own session; an environment of SANDBOX_ENV only; of the host's files /usr
read-only (and the links Debian's merged /usr has), with a fresh /proc, a minimal /dev, a bounded
tmpfs as /tmp and the child program at /sandbox/child.py. No /etc, /home, /root, /var, /run or
the platform's folders: the OS's python needs none of them.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import resource
import select
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from tuneforge.graders import sandbox_seccomp

log = logging.getLogger(__name__)

BWRAP = "/usr/bin/bwrap"
CHILD_PATH = "/sandbox/child.py"  # where the sandbox sees sandbox_child.py
# the sandbox's whole environment (bwrap adds PWD=/tmp, the working directory)
SANDBOX_ENV = {"PATH": "/usr/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0",
               "HOME": "/tmp"}
# As root, each sandbox runs as a uid of its own, so that RLIMIT_NPROC (which root is exempt from)
# counts that sandbox's processes only: UID_BASE + (pid << SLOT_BITS) + a counter of the process.
# The operator keeps [UID_BASE, UID_BASE + 2**31) free of real users.
UID_BASE = 200_000
SLOT_BITS = 9
PID_SLOTS = 1 << 22  # the kernel's largest pid_max
OPEN_FILES = 64
READ_CHUNK_BYTES = 1 << 16
STDERR_KEPT_BYTES = 4096

_slot_counter = itertools.count()
_child_bytes: bytes | None = None


class Broken(Exception):
    """The sandbox process cannot go on: `reason` is ended, timeout, too_large or garbled."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def uid_range(pid: int) -> range:
    """The uids the sandboxes of process `pid` run as, when it runs as root."""
    first = UID_BASE + ((pid % PID_SLOTS) << SLOT_BITS)
    return range(first, first + (1 << SLOT_BITS))


def _processes_where(field: str, value: int) -> list[tuple[int, int]]:
    """(pid, threads) of every process whose /proc status `field` (its first number) is `value`."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            status = Path(entry.path, "status").read_text()
        except OSError:  # it ended meanwhile
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if field in fields and int(fields[field].split()[0]) == value:
            found.append((int(entry.name), int(fields.get("Threads", "1"))))
    return found


def processes_of(uid: int) -> list[tuple[int, int]]:
    """(pid, threads) of every process whose real uid is `uid`."""
    return _processes_where("Uid", uid)


def _memfd(name: str, data: bytes) -> int:
    """A file descriptor holding `data` from its start: how bwrap receives files (no host path)."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _child_source() -> bytes:
    global _child_bytes
    if _child_bytes is None:
        _child_bytes = Path(__file__).with_name("sandbox_child.py").read_bytes()
    return _child_bytes


def _bwrap_args(python: str, scratch_bytes: int, child_fd: int, seccomp_fd: int) -> list[str]:
    # --as-pid-1: no bwrap init in the sandbox; the interpreter is pid 1 (it reaps what the
    # tenant forks, sandbox_child.py), so bwrap is its parent and reaps it when it ends
    args = [BWRAP, "--unshare-all", "--unshare-user", "--disable-userns", "--as-pid-1", "--die-with-parent",
            "--new-session", "--cap-drop", "ALL", "--hostname", "grader", "--clearenv"]
    for name, value in SANDBOX_ENV.items():
        args += ["--setenv", name, value]
    args += ["--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
             "--symlink", "usr/lib64", "/lib64", "--proc", "/proc", "--dev", "/dev",
             "--size", str(scratch_bytes), "--tmpfs", "/tmp", "--chdir", "/tmp",
             "--ro-bind-data", str(child_fd), CHILD_PATH, "--seccomp", str(seccomp_fd),
             # bwrap's own root and /dev are tmpfs of no size limit: read-only, /tmp is the only
             # place to write (a device node stays writable on a read-only mount)
             "--remount-ro", "/dev", "--remount-ro", "/"]
    return [*args, python, "-s", CHILD_PATH]


def _rlimits(*, cpu_time_s: int, memory_bytes: int, scratch_bytes: int, processes: int) -> list[tuple[int, int, int]]:
    # the hard CPU limit is the soft one: the interpreter is its namespace's init, which ignores
    # SIGXCPU (signals it has no handler for), so the kernel's SIGKILL at the hard limit ends it
    wanted = [(resource.RLIMIT_CPU, cpu_time_s, cpu_time_s),
              (resource.RLIMIT_AS, memory_bytes, memory_bytes),
              (resource.RLIMIT_FSIZE, scratch_bytes, scratch_bytes),
              (resource.RLIMIT_NOFILE, OPEN_FILES, OPEN_FILES),
              (resource.RLIMIT_CORE, 0, 0),
              (resource.RLIMIT_NPROC, processes, processes)]
    clamped = []
    for which, soft, hard in wanted:
        ceiling = resource.getrlimit(which)[1]  # a non-root parent cannot raise its hard limits
        if ceiling != resource.RLIM_INFINITY:
            soft, hard = min(soft, ceiling), min(hard, ceiling)
        clamped.append((which, soft, hard))
    return clamped


def launch(python: str, *, cpu_time_s: int, memory_bytes: int, scratch_bytes: int, processes: int,
           output_bytes: int) -> Running:
    """Starts bwrap on the child program. As root, bwrap runs as a fresh unprivileged uid (and so
    creates its user namespace unprivileged); otherwise as the platform's own uid."""
    as_root = os.geteuid() == 0
    uid = uid_range(os.getpid()).start + next(_slot_counter) % (1 << SLOT_BITS)
    if not as_root:
        # RLIMIT_NPROC counts every thread of the real uid: what runs now plus the sandbox's share
        # (approximate: the user's other processes may start or end meanwhile)
        processes += sum(threads for _, threads in processes_of(os.getuid()))
    table = _rlimits(cpu_time_s=cpu_time_s, memory_bytes=memory_bytes, scratch_bytes=scratch_bytes,
                     processes=processes)

    def set_limits() -> None:  # in the child, after the uid change, before exec
        for which, soft, hard in table:
            resource.setrlimit(which, (soft, hard))

    identity: dict[str, Any] = {"user": uid, "group": uid, "extra_groups": []} if as_root else {}
    child_fd = _memfd("grader-child", _child_source())
    seccomp_fd = _memfd("grader-seccomp", sandbox_seccomp.program())
    try:
        popen = subprocess.Popen(
            _bwrap_args(os.path.realpath(python), scratch_bytes, child_fd, seccomp_fd), stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={}, cwd="/", pass_fds=(child_fd, seccomp_fd),
            start_new_session=True, preexec_fn=set_limits, bufsize=0, **identity)
    finally:
        os.close(child_fd)
        os.close(seccomp_fd)
    return Running(popen, uid if as_root else None, output_bytes)


def _parse(line: bytes) -> dict[str, Any]:
    def reject(name: str) -> None:
        raise ValueError(f"{name} is not a number")

    try:
        message = json.loads(line, parse_constant=reject)
    except (ValueError, RecursionError) as exc:
        raise Broken("garbled") from exc
    if not isinstance(message, dict):
        raise Broken("garbled")
    return message


class Running:
    """One started sandbox process and its pipes."""

    def __init__(self, popen: subprocess.Popen[bytes], uid: int | None, output_bytes: int) -> None:
        assert popen.stdin is not None and popen.stdout is not None and popen.stderr is not None
        self.popen = popen
        self.uid = uid
        self._output_bytes = output_bytes
        self._in_fd = popen.stdin.fileno()
        self._out_fd = popen.stdout.fileno()
        for fd in (self._in_fd, self._out_fd, popen.stderr.fileno()):
            os.set_blocking(fd, False)
        self._pending = bytearray()

    def _wait(self, fd: int, event: int, deadline: float) -> None:
        left_s = deadline - time.monotonic()
        poller = select.poll()  # not select(): the platform's fds may be numbered over 1024
        poller.register(fd, event)
        if left_s <= 0 or not poller.poll(left_s * 1000):
            raise Broken("timeout")

    def send(self, line: bytes, deadline: float) -> None:
        data = memoryview(line)
        while data:
            self._wait(self._in_fd, select.POLLOUT, deadline)
            try:
                data = data[os.write(self._in_fd, data):]
            except BlockingIOError:
                continue
            except OSError as exc:  # the pipe's reader is gone
                raise Broken("ended") from exc

    def receive(self, deadline: float) -> dict[str, Any]:
        """The next line, parsed; at most output_bytes are kept whatever the child writes."""
        while True:
            newline = self._pending.find(b"\n")
            if newline >= 0:
                line = bytes(self._pending[:newline])
                del self._pending[: newline + 1]
                if newline > self._output_bytes:
                    raise Broken("too_large")
                return _parse(line)
            if len(self._pending) > self._output_bytes:
                raise Broken("too_large")
            self._wait(self._out_fd, select.POLLIN, deadline)
            try:
                chunk = os.read(self._out_fd, READ_CHUNK_BYTES)
            except BlockingIOError:
                continue
            if not chunk:
                raise Broken("ended")
            self._pending += chunk

    def exit_status(self) -> int | None:
        """bwrap's exit status once its pipe closed (it passes on its child's: 128 + a signal)."""
        try:
            return self.popen.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            return None

    def stderr_head(self) -> str:
        """What bwrap or the interpreter said before the child took fd 2 (for the operator's log)."""
        assert self.popen.stderr is not None
        try:
            return os.read(self.popen.stderr.fileno(), STDERR_KEPT_BYTES).decode(errors="replace").strip()
        except OSError:
            return ""

    def stop(self) -> None:
        """Kills the process tree and waits for it to be gone.

        The interpreter is pid 1 of the sandbox's pid namespace (--as-pid-1) and is killed first:
        the kernel then kills every process of the namespace, and bwrap, its parent, reaps it and
        exits (bwrap killed first would leave it to the host's init to reap, at that init's pace).
        As root, any process left of the sandbox's uid is killed too."""
        for pid, _ in _processes_where("PPid", self.popen.pid):
            _kill(pid)
        try:
            self.popen.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.popen.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            log.warning("grader sandbox %d did not end after SIGKILL", self.popen.pid)
        for stream in (self.popen.stdin, self.popen.stdout, self.popen.stderr):
            if stream is not None:
                stream.close()
        if self.uid is not None:
            _end_uid(self.uid, deadline=time.monotonic() + 2.0)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _end_uid(uid: int, deadline: float) -> None:
    """SIGKILLs the uid's processes until none is left (the uid is one sandbox's alone)."""
    while True:
        left = processes_of(uid)
        if not left or time.monotonic() > deadline:
            if left:
                log.warning("grader sandbox uid %d still has processes %s", uid, [pid for pid, _ in left])
            return
        for pid, _ in left:
            _kill(pid)
        time.sleep(0.005)
