"""What the Ray executor runs on a node: one `TrainerHost` actor per node of an attempt.

The actor lives in its bundle of the attempt's placement group, so Ray has
reserved its GPUs (and set CUDA_VISIBLE_DEVICES) before it starts. It starts
one trainer per rank that runs on its node — the same entry point, exit codes
and SIGTERM behaviour as under the local executor — and answers the control
plane's questions: where it runs (for the process group's rendezvous), how its
ranks are doing, and the tail of rank 0's log. Signals go to every rank's
process group.

A rank's trainer is forked from the node's warm trainer (`NodeWarmer`: a
detached actor per node that keeps one `python -m tuneforge.train.warm`, see
executors/warm.py), so only the node's first attempt pays for importing torch,
transformers and peft; the first one waits for those imports rather than
importing them again beside them. Where that is off
(TUNEFORGE_TRAINER_WARM_START=false), fails or takes too long, the rank is a
fresh `python -m tuneforge.train SPEC`.

Nothing here decides anything: retries, requeues and preemptions are the
scheduler's. The actor is created with `max_restarts=0`; if its node dies it
is gone, and the trainers die with it: one it started asks the kernel to be
killed when the actor's process exits (the parent-death signal), one forked
warm has its group killed when the actor's process ends (a pidfd it watches),
so a lost node never leaves a trainer behind.

This module is imported on every node; it needs only the standard library,
Ray and the trainers' allow-listed environment (`tuneforge.security.env`),
warm trainer (`tuneforge.executors.warm`) and exit-code files.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal as signals
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tuneforge.executors.warm import WarmTrainer
from tuneforge.security.env import child_env, open_private, private_dirs
from tuneforge.train.__main__ import read_exit_file
from tuneforge.train.warm import process_start_time

log = logging.getLogger(__name__)

WARM_WAIT_S = 120.0  # the longest a node's first trainer waits for the warm trainer's imports


def spec_name(rank: int) -> str:
    """Each rank's copy of the spec: its trainer leaves its exit code beside it (`.exit`)."""
    return f"spec-rank-{int(rank)}.json"


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


def warmer_name(node_id: str, runtime_env: Any) -> str:
    """The name of a node's NodeWarmer for this code: a warm trainer has imported the code of
    the day it started, and outlives control planes, so one installed later (another tuneforge,
    another runtime_env, another interpreter) gets a warm trainer of its own."""
    import tuneforge

    code = json.dumps([tuneforge.__version__, str(Path(tuneforge.__file__).parent), sys.executable,
                       dict(runtime_env or {})], sort_keys=True, default=str)
    return f"tuneforge-warm-trainer:{node_id}:{hashlib.sha256(code.encode()).hexdigest()[:12]}"


class NodeWarmer:
    """A node's warm trainers, one per trainer environment (the store's settings, the egress
    allow-list: one per control plane, as a rule), kept by a detached actor of their own
    (`warmer_name`) for every TrainerHost of that node. The warm process dies
    with this actor (the parent-death signal); the trainers it forked belong to their hosts."""

    def __init__(self, workdir: str) -> None:
        self.workdir = Path(workdir)
        private_dirs(self.workdir)
        self._trainers: dict[frozenset[tuple[str, str]], WarmTrainer] = {}

    def launch(self, env: dict[str, str], spec_path: str, rank_env: dict[str, str], cwd: str, log_path: str,
               watch: int, wait_s: float) -> list[Any] | None:
        """[pid, start time] of a trainer forked for `spec_path` with `rank_env`, its group killed
        once the process `watch` ends; None if the warm trainer for `env` was not ready within
        `wait_s` (it keeps importing for the next attempt) or could not fork."""
        base = child_env({"TOKENIZERS_PARALLELISM": "false", **env})
        key = frozenset(base.items())
        trainer = self._trainers.get(key)
        if trainer is None:
            log_path_of_warm = self.workdir / f"warm-trainer-{os.getpid()}-{len(self._trainers)}.log"
            trainer = self._trainers[key] = WarmTrainer(base, log_path_of_warm, preexec_fn=parent_death_hook())
        if not trainer.wait_ready(wait_s):
            return None
        forked = trainer.launch(spec_path, rank_env, cwd, log_path, watch=watch)
        return list(forked) if forked is not None else None


class TrainerHost:
    """One node's share of an attempt: its ranks, their processes and logs."""

    def __init__(self, attempt_name: str, workdir_template: str, cache_dir_template: str) -> None:
        import ray

        self.node_id = ray.get_runtime_context().get_node_id()
        safe_name = "".join(c if c.isalnum() or c in "._-" else "_" for c in attempt_name)
        self.node_workdir = Path(expand_node_path(workdir_template, self.node_id))
        self.workdir = self.node_workdir / safe_name
        self.cache_dir = expand_node_path(cache_dir_template, self.node_id)
        self.procs: dict[int, subprocess.Popen] = {}
        self.forked: dict[int, tuple[int, str, str]] = {}  # rank -> pid, start time, spec (forked warm)
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
              master_address: str, master_port: int, warm_wait_s: float | None = None) -> list[int]:
        """Start one trainer per rank in `ranks`, forked from the node's warm trainer when
        `warm_wait_s` is given (the longest to wait for it), else fresh; returns their pids."""
        spec = json.loads(spec_json)
        spec["cache_dir"] = self.cache_dir  # base models come from this node's cache, keyed by SHA
        private_dirs(self.workdir)
        from tuneforge.domain.rendezvous import rendezvous_env  # torchrun's variables

        warmer = self._warmer() if warm_wait_s is not None else None
        pids = []
        for local_rank, rank in enumerate(ranks):
            spec_path = self.workdir / spec_name(rank)
            with open_private(spec_path, "w") as handle:  # the spec holds the job token: this user's only
                handle.write(json.dumps(spec, indent=2, sort_keys=True))
            extra = {"TOKENIZERS_PARALLELISM": "false", **env, "TUNEFORGE_NODE": self.node_id}
            if world > 1:  # every rank is started here, so rank 0 starts no workers of its own
                extra.update(rendezvous_env(rank, world, local_rank, len(ranks), master_address, master_port))
            log_path = self.workdir / f"rank-{rank}.log"
            self._logs[rank] = log_path
            forked = self._fork(warmer, env, spec_path, child_env(extra), log_path, warm_wait_s)
            if forked is not None:
                self.forked[rank] = (forked[0], forked[1], str(spec_path))
                pids.append(forked[0])
                _note(log_path, f"rank {rank}: forked from the node's warm trainer as pid {forked[0]}")
                continue
            _note(log_path, f"rank {rank}: a fresh python -m tuneforge.train")
            with open_private(log_path, "ab") as log:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "tuneforge.train", str(spec_path)],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=child_env(extra),
                    cwd=str(self.workdir), start_new_session=True,
                    preexec_fn=parent_death_hook(),  # noqa: PLW1509 - only calls prctl
                )
            self.procs[rank] = proc
            pids.append(proc.pid)
        return pids

    def _warmer(self) -> Any:
        """The node's NodeWarmer actor, made by the first host that asks (None if it cannot be)."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        context = ray.get_runtime_context()
        runtime_env = context.runtime_env
        options: dict[str, Any] = {
            "name": warmer_name(self.node_id, runtime_env), "namespace": context.namespace,
            "lifetime": "detached", "get_if_exists": True, "num_cpus": 0, "max_restarts": 0,
            "scheduling_strategy": NodeAffinitySchedulingStrategy(self.node_id, soft=False),
        }
        if runtime_env:  # the environment tuneforge is installed in, as this actor's
            options["runtime_env"] = runtime_env
        try:
            return ray.remote(NodeWarmer).options(**options).remote(str(self.node_workdir))
        except Exception:  # noqa: BLE001 - no warm trainer: the ranks start fresh
            log.warning("the node's warm trainer actor could not be made", exc_info=True)
            return None

    def _fork(self, warmer: Any, env: dict[str, str], spec_path: Path, rank_env: dict[str, str], log_path: Path,
              wait_s: float | None) -> tuple[int, str] | None:
        if warmer is None or wait_s is None:
            return None
        import ray

        try:
            forked = ray.get(warmer.launch.remote(env, str(spec_path), rank_env, str(self.workdir), str(log_path),
                                                  os.getpid(), wait_s), timeout=wait_s + 30)
        except Exception:  # noqa: BLE001 - the warm trainer's actor is gone or stuck: start fresh
            log.warning("the node's warm trainer did not answer", exc_info=True)
            return None
        if not forked:
            return None
        return int(forked[0]), str(forked[1])

    def status(self) -> dict[int, int | None]:
        """rank -> exit code, or None while the process runs."""
        codes = {rank: proc.poll() for rank, proc in self.procs.items()}
        for rank, (pid, started, spec_path) in self.forked.items():
            if process_start_time(pid) == started:
                codes[rank] = None
            else:  # its warm parent writes -signal for one a signal ended; none at all: killed outright
                code = read_exit_file(spec_path)
                codes[rank] = -int(signals.SIGKILL) if code is None else code
        return dict(sorted(codes.items()))

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
        """Kill whatever still runs and reap it (the attempt has ended). The specs go too:
        they hold the job token; the logs stay for whoever debugs the attempt."""
        self._send(signals.SIGKILL)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        deadline = time.monotonic() + 10
        while any(self._forked_alive(rank) for rank in self.forked) and time.monotonic() < deadline:
            time.sleep(0.05)  # their warm parent reaps them
        for rank in [*self.procs, *self.forked]:
            (self.workdir / spec_name(rank)).unlink(missing_ok=True)

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

    def _forked_alive(self, rank: int) -> bool:
        pid, started, _spec = self.forked[rank]
        return process_start_time(pid) == started

    def _send(self, sig: int) -> None:
        pids = [proc.pid for proc in self.procs.values() if proc.poll() is None]
        pids += [self.forked[rank][0] for rank in self.forked if self._forked_alive(rank)]
        for pid in pids:
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                pass


def _note(log_path: Path, line: str) -> None:
    """A line of the host's own in a rank's log (appended: the rank may be writing already)."""
    try:
        with open_private(log_path, "ab") as log:
            log.write(f"[tuneforge host] {line}\n".encode())
    except OSError:
        pass


def free_resources_per_node() -> dict[str, dict[str, float]]:
    """Ray's free resources on every node, read inside the cluster: run as a zero-CPU task
    for a control plane connected through Ray Client, where the state API is out of reach."""
    from ray._private.state import available_resources_per_node

    return available_resources_per_node()
