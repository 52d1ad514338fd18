"""The local executor's warm trainer: one process per environment that has imported what every
trainer imports, asked to fork each attempt's trainer (tuneforge/train/warm.py says how and
why that is safe).

It is started when the control plane starts scheduling (`LocalExecutor.prepare`), or else on
the first launch that wants it, in the background: a launch made before it is ready starts its
trainer cold (`python -m tuneforge.train`), as does every launch if it cannot start or stops
answering. Started once per control-plane process and trainer
environment (the environment is fixed when it starts: the store's settings, the egress
allow-list), it serves every local executor of the process with that environment, and goes when
the process does (its stdin closes). TUNEFORGE_TRAINER_WARM_START=false starts every trainer cold.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from select import select as wait_readable
from typing import IO, Any

from tuneforge.security.env import open_private

log = logging.getLogger(__name__)

REPLY_TIMEOUT_S = 30.0
MAX_STARTS = 3  # a warm trainer that keeps failing to start is given up: trainers start cold


class WarmTrainer:
    def __init__(self, env: dict[str, str], log_path: Path,
                 preexec_fn: Callable[[], object] | None = None) -> None:
        self.env = dict(env)
        self.log_path = log_path
        self._preexec_fn = preexec_fn  # e.g. the parent-death signal of a Ray node's warm trainer
        self._proc: subprocess.Popen | None = None
        self._ready = threading.Event()
        self._lock = threading.Lock()
        self._starts = 0

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def ready(self) -> bool:
        return self._ready.is_set() and self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        """Start the process unless it runs or was given up (MAX_STARTS); it says when it is
        ready, in the background."""
        with self._lock:
            if (self._proc is not None and self._proc.poll() is None) or self._starts >= MAX_STARTS:
                return
            self._ready.clear()
            self._starts += 1
            with open_private(self.log_path, "ab") as errors:
                self._proc = subprocess.Popen(
                    [sys.executable, "-m", "tuneforge.train.warm"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                    stderr=errors, env=self.env, cwd="/", start_new_session=True,
                    preexec_fn=self._preexec_fn,  # noqa: PLW1509 - a prctl call at most
                )
            threading.Thread(target=self._await_ready, args=(self._proc,), name="tuneforge-warm-trainer",
                             daemon=True).start()

    def _await_ready(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        try:
            message = json.loads(line) if line else {"ready": False, "error": "exited while importing"}
        except ValueError:
            message = {"ready": False, "error": "an unreadable first line"}
        if message.get("ready") is True:
            self._ready.set()
        else:
            log.warning("the warm trainer did not start (%s): trainers start cold; see %s",
                        message.get("error"), self.log_path)

    def wait_ready(self, timeout_s: float) -> bool:
        """Start it if needed, then wait up to `timeout_s` for it to be ready."""
        self.start()
        self._ready.wait(timeout_s)
        return self.ready()

    def launch(self, spec_path: str, env: dict[str, str], cwd: str, log_path: str,
               watch: int | None = None) -> tuple[int, str] | None:
        """The pid and start time of the attempt's trainer, forked warm (its group killed when the
        process `watch` ends, if given); None when no warm trainer is ready (the caller then starts
        one cold): it is then started, or started again if it went, at most MAX_STARTS times in all."""
        request: dict[str, Any] = {"spec": spec_path, "env": env, "cwd": cwd, "log": log_path}
        if watch is not None:
            request["watch"] = watch
        with self._lock:
            proc = self._proc
            alive = proc is not None and proc.poll() is None
            if proc is not None and alive and self._ready.is_set():
                reply = self._ask(proc, request)
                if isinstance(reply.get("pid"), int) and isinstance(reply.get("started"), str):
                    return int(reply["pid"]), reply["started"]
                log.warning("the warm trainer could not start an attempt (%s): starting it cold",
                            reply.get("error"))
                if reply.get("broken"):
                    _stop(proc)
                    self._proc, alive = None, False
            if alive or self._starts >= MAX_STARTS:
                return None
        self.start()
        return None

    @staticmethod
    def _ask(proc: subprocess.Popen, request: dict[str, Any]) -> dict[str, Any]:
        stdin, stdout = proc.stdin, proc.stdout
        assert stdin is not None and stdout is not None
        try:
            stdin.write((json.dumps(request) + "\n").encode())
            stdin.flush()
            readable, _, _ = wait_readable([stdout], [], [], REPLY_TIMEOUT_S)
            line = stdout.readline() if readable else b""
            reply = json.loads(line) if line else {"error": "no answer", "broken": True}
        except (OSError, ValueError) as exc:
            return {"error": f"{type(exc).__name__}: {exc}", "broken": True}
        return reply if isinstance(reply, dict) else {"error": "not an object", "broken": True}

    def close(self) -> None:
        with self._lock:
            if self._proc is not None:
                if self._ready.is_set():
                    _stop(self._proc)
                else:  # still importing: nothing was forked
                    self._proc.kill()
                    self._proc.wait()
                self._proc = None


def _stop(proc: subprocess.Popen) -> None:
    """Close its stdin: it exits by itself (its children run on)."""
    stdin: IO[bytes] | None = proc.stdin
    try:
        if stdin is not None:
            stdin.close()
        proc.wait(timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        proc.kill()


_by_env: dict[frozenset[tuple[str, str]], WarmTrainer] = {}
_by_env_lock = threading.Lock()


def warm_trainer(env: dict[str, str], log_dir: Path) -> WarmTrainer:
    """This process's warm trainer for `env` (made on first use; not started yet)."""
    key = frozenset(env.items())
    with _by_env_lock:
        trainer = _by_env.get(key)
        if trainer is None:
            trainer = _by_env[key] = WarmTrainer(env, log_dir / f"warm-trainer-{os.getpid()}.log")
        return trainer


@atexit.register
def _close_all() -> None:
    with _by_env_lock:
        for trainer in _by_env.values():
            trainer.close()
        _by_env.clear()
