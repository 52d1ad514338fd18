"""What the Ray executor runs on a node: one `TrainerHost` actor per node of an attempt.

The actor lives in its bundle of the attempt's placement group, so Ray has
reserved its GPUs (and set CUDA_VISIBLE_DEVICES) before it starts. It starts
the trainer entry point, `python -m tuneforge.train SPEC`, once per rank that
runs on its node — the same process, exit codes and SIGTERM behaviour as
under the local executor — and answers the control plane's questions: where
it runs (for the process group's rendezvous), how its ranks are doing, and
the tail of rank 0's log. Signals go to every rank's process group.

Nothing here decides anything: retries, requeues and preemptions are the
scheduler's. The actor is created with `max_restarts=0`; if its node dies it
is gone, and the trainers die with it (they ask the kernel to be killed when
the actor's process exits), so a lost node never leaves a trainer behind.

This module is imported on every node; it needs only the standard library,
Ray and `tuneforge.security.env` (the trainers' allow-listed environment, private files).
"""

from __future__ import annotations

import json
import os
import signal as signals
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from tuneforge.security.env import child_env, open_private, private_dirs

SPEC_NAME = "spec.json"


def expand_node_path(template: str, node_id: str) -> str:
    """A node-local folder: `~` expanded, `{node_id}` replaced by the node's Ray id (for
    hosts that run several Ray nodes, as test clusters do)."""
    return os.path.expanduser(template.replace("{node_id}", node_id))


def parent_death_hook(sig: int = signals.SIGKILL):  # noqa: ANN201
    """A pre-exec hook (Linux) that has the kernel send `sig` to the child when the process
    that started it exits, however it exits (a node lost, the actor killed). libc is loaded
    here, in the parent: between fork and exec only the prctl call itself runs."""
    if sys.platform != "linux":
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1
    return lambda: prctl(pr_set_pdeathsig, sig)


class TrainerHost:
    """One node's share of an attempt: its ranks, their processes and logs."""

    def __init__(self, attempt_name: str, workdir_template: str, cache_dir_template: str) -> None:
        import ray

        self.node_id = ray.get_runtime_context().get_node_id()
        safe_name = "".join(c if c.isalnum() or c in "._-" else "_" for c in attempt_name)
        self.workdir = Path(expand_node_path(workdir_template, self.node_id)) / safe_name
        self.cache_dir = expand_node_path(cache_dir_template, self.node_id)
        self.procs: dict[int, subprocess.Popen] = {}
        self._logs: dict[int, Path] = {}
        self._kill_timer: threading.Timer | None = None

    def where(self) -> dict[str, Any]:
        """The node, its address and a free port there: rank 0's host publishes these for the
        process group's rendezvous."""
        import ray

        address = ray.util.get_node_ip_address()
        with socket.socket() as sock:
            sock.bind((address, 0))
            port = sock.getsockname()[1]
        return {"node_id": self.node_id, "address": address, "port": port, "pid": os.getpid()}

    def start(self, spec_json: str, env: dict[str, str], ranks: list[int], world: int,
              master_address: str, master_port: int) -> list[int]:
        """Start one trainer process per rank in `ranks`; returns their pids."""
        spec = json.loads(spec_json)
        spec["cache_dir"] = self.cache_dir  # base models come from this node's cache, keyed by SHA
        private_dirs(self.workdir)
        spec_path = self.workdir / SPEC_NAME
        # the spec holds the job token: readable by this user only
        fd = os.open(spec_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(json.dumps(spec, indent=2, sort_keys=True))
        from tuneforge.domain.rendezvous import rendezvous_env  # torchrun's variables

        hook = parent_death_hook()
        pids = []
        for local_rank, rank in enumerate(ranks):
            extra = {"TOKENIZERS_PARALLELISM": "false", **env, "TUNEFORGE_NODE": self.node_id}
            if world > 1:  # every rank is started here, so rank 0 starts no workers of its own
                extra.update(rendezvous_env(rank, world, local_rank, len(ranks), master_address, master_port))
            log_path = self.workdir / f"rank-{rank}.log"
            with open_private(log_path, "ab") as log:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "tuneforge.train", str(spec_path)],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=child_env(extra),
                    cwd=str(self.workdir), start_new_session=True,
                    preexec_fn=hook,  # noqa: PLW1509 - only calls prctl
                )
            self.procs[rank] = proc
            self._logs[rank] = log_path
            pids.append(proc.pid)
        return pids

    def status(self) -> dict[int, int | None]:
        """rank -> exit code, or None while the process runs."""
        return {rank: proc.poll() for rank, proc in self.procs.items()}

    def signal(self, action: str, grace_s: float) -> None:
        """preempt: SIGTERM (checkpoint, then exit), SIGKILL after `grace_s`; cancel: SIGKILL."""
        if action == "preempt":
            self._send(signals.SIGTERM)
            if self._kill_timer is None:
                self._kill_timer = threading.Timer(grace_s, self._send, (signals.SIGKILL,))
                self._kill_timer.daemon = True
                self._kill_timer.start()
        else:
            self._send(signals.SIGKILL)

    def stop(self) -> None:
        """Kill whatever still runs and reap it (the attempt has ended). The spec goes too:
        it holds the job token; the logs stay for whoever debugs the attempt."""
        self._send(signals.SIGKILL)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        (self.workdir / SPEC_NAME).unlink(missing_ok=True)

    def log_tail(self, max_bytes: int = 4000) -> str:
        if not self._logs:
            return ""
        path = self._logs[min(self._logs)]
        try:
            with open(path, "rb") as log:
                log.seek(max(0, path.stat().st_size - max_bytes))
                return log.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def _send(self, sig: int) -> None:
        for proc in self.procs.values():
            if proc.poll() is not None:
                continue
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass


def free_resources_per_node() -> dict[str, dict[str, float]]:
    """Ray's free resources on every node, read inside the cluster: run as a zero-CPU task
    for a control plane connected through Ray Client, where the state API is out of reach."""
    from ray._private.state import available_resources_per_node

    return available_resources_per_node()
