"""Local executor: each attempt is a subprocess on this host.

GPUs are handed out with CUDA_VISIBLE_DEVICES; on a CPU-only host
`TUNEFORGE_LOCAL_GPUS` sets how many logical slots exist. A process launched by
an earlier control-plane process is still found through /proc by its pid and
spec path, so a restart does not orphan running attempts.
"""

from __future__ import annotations

import functools
import os
import signal as signals
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tuneforge.domain.spec import JobSpec
from tuneforge.executors.protocol import Capacity, NodeCapacity, Placement, PollResult
from tuneforge.executors.warm import warm_trainer
from tuneforge.security.env import child_env, open_private, private_dirs
from tuneforge.settings import Settings
from tuneforge.storage import layout
from tuneforge.train.__main__ import read_exit_file
from tuneforge.train.warm import process_start_time

NODE_NAME = "local"


def node_name(index: int) -> str:
    return NODE_NAME if index == 0 else f"{NODE_NAME}-{index}"


@dataclass(frozen=True)
class GpuHardware:
    """This host's GPUs: model and memory of one GPU in GiB ("" and 0: unknown)."""

    model: str = ""
    memory_gb: float = 0.0


NvmlReader = Callable[[int], GpuHardware]


@functools.lru_cache(maxsize=8)
def read_nvml(devices: int) -> GpuHardware:
    """The first `devices` GPUs as NVML sees them: the first one's model and the smallest memory
    (what every slot can count on). Unknown, silently, where NVML is absent (a CPU-only host).
    Read once per process: the hardware does not change under a running control plane."""
    try:
        import pynvml as nvml

        nvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no library, no driver, no GPU: all mean "unknown"
        return GpuHardware()
    try:
        count = min(max(1, devices), nvml.nvmlDeviceGetCount())
        handles = [nvml.nvmlDeviceGetHandleByIndex(index) for index in range(count)]
        if not handles:
            return GpuHardware()
        name = nvml.nvmlDeviceGetName(handles[0])
        model = name.decode() if isinstance(name, bytes) else str(name)
        memory = min(int(nvml.nvmlDeviceGetMemoryInfo(handle).total) for handle in handles)
        return GpuHardware(model.strip(), round(memory / 2**30, 1))
    except Exception:  # noqa: BLE001 - a driver that answers some calls and not others: unknown
        return GpuHardware()
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def local_hardware(settings: Settings, nvml: NvmlReader = read_nvml) -> GpuHardware:
    """The settings' model and memory where set (TUNEFORGE_LOCAL_GPU_MODEL, _MEMORY_GB), else NVML's."""
    model, memory_gb = settings.local_gpu_model.strip(), float(settings.local_gpu_memory_gb)
    if (not model or memory_gb <= 0) and int(settings.local_gpus) > 0:
        read = nvml(int(settings.local_gpus))
        model, memory_gb = model or read.model, memory_gb if memory_gb > 0 else read.memory_gb
    return GpuHardware(model, memory_gb)


def local_inventory(settings: Settings, nvml: NvmlReader = read_nvml) -> Capacity:
    """`local_nodes` logical nodes of `local_gpus` slots each, with this host's GPU model and memory."""
    gpus = max(0, int(settings.local_gpus))
    hardware = local_hardware(settings, nvml)
    return Capacity(nodes=[NodeCapacity(node_name(i), gpus, gpus, gpu_model=hardware.model,
                                        gpu_memory_gb=hardware.memory_gb,
                                        interconnect=settings.local_interconnect.strip())
                           for i in range(max(1, int(settings.local_nodes)))])


BWRAP = "/usr/bin/bwrap"  # bubblewrap, as the python graders' sandbox uses it


class LocalExecutor:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.total_gpus = max(0, int(settings.local_gpus))
        self.workdir = (settings.home / "attempts").resolve()
        private_dirs(self.workdir)
        self._children: dict[int, subprocess.Popen] = {}
        # the trainers' environment but each attempt's GPUs and node, which the fork sets; none where
        # no attempt can ever start (no slots: every job asks for at least one)
        warm = settings.trainer_warm_start and self.total_gpus > 0 and settings.trainer_isolation == "none"
        self._warm = warm_trainer(child_env({**settings.trainer_env(), "TOKENIZERS_PARALLELISM": "false"}),
                                  self.workdir) if warm else None

    def prepare(self) -> None:
        """Start the warm trainer now, not on the first launch: that launch, and any made before
        it is ready, would start their trainers cold."""
        if self._warm is not None:
            self._warm.start()

    def capacity(self) -> Capacity:
        """`local_nodes` logical nodes of `local_gpus` slots each (free counts: the scheduler
        knows which slots its attempts hold; this host cannot tell)."""
        for proc in list(self._children.values()):
            proc.poll()  # reaps finished children
        return local_inventory(self.settings)

    def launch(self, spec: JobSpec, placement: Placement) -> dict[str, Any]:
        stem = f"{spec.job_id}-attempt-{spec.attempt}"
        folder = self.workdir
        if self.settings.trainer_isolation == "namespace":  # a folder of its own: all it sees of the home
            folder = self.workdir / stem
            private_dirs(folder / "tmp")
        spec_path = folder / f"{stem}.json"
        log_path = folder / f"{stem}.log"
        with open_private(spec_path, "w") as handle:  # the spec holds the job token: this user's only
            handle.write(spec.to_json())
        env = self.attempt_env(placement)
        handle = {"spec_path": str(spec_path), "log_path": str(log_path), "node": placement.node}
        if self._warm is not None:
            forked = self._warm.launch(str(spec_path), env, str(self.workdir), str(log_path))
            if forked is not None:
                # not this process's child: told apart from a later process of the same pid by its start
                return {"pid": forked[0], "started": forked[1], "warm": True, **handle}
        argv = [sys.executable, "-m", "tuneforge.train", str(spec_path)]
        if self.settings.trainer_isolation == "namespace":
            argv, env = self.isolated(argv, folder, env)
        with open_private(log_path, "ab") as log:
            proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, cwd=str(folder), start_new_session=True,
            )
        self._children[proc.pid] = proc
        return {"pid": proc.pid, **handle}

    def isolated(self, argv: list[str], folder: Path, env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        """`argv` run in a mount namespace of its own (bubblewrap; TUNEFORGE_TRAINER_ISOLATION=namespace):
        the host's files read-only, the platform's home an empty folder but for the attempt's `folder`
        (its spec, log and exit file) and the base-model cache, a scratch /tmp of its own on disk, the
        host's /dev (GPUs) and network (the control plane's routes). Its own user namespace too; the
        process is still the platform's user to the host's kernel, so the files it can reach are only
        what the namespace shows it."""
        home = self.settings.home.resolve()
        cache = layout.home_base_model_cache_dir(home).resolve()
        private_dirs(cache)
        scratch = folder / "tmp"
        # no capability inside either: nothing mounted here can be taken away to show what it hides
        sandbox = [BWRAP, "--unshare-user", "--unshare-ipc", "--unshare-uts", "--hostname", "trainer",
                   "--cap-drop", "ALL", "--ro-bind", "/", "/", "--dev-bind", "/dev", "/dev", "--proc", "/proc",
                   # /tmp first: a home under /tmp is then hidden and shown again inside it
                   "--bind", str(scratch), "/tmp", *_code_under_tmp(),
                   "--tmpfs", str(home), "--bind", str(folder), str(folder), "--bind", str(cache), str(cache),
                   "--chdir", str(folder), "--"]
        inside = {**env, "HOME": str(folder), "TMPDIR": "/tmp", "XDG_CACHE_HOME": str(scratch),
                  "TRITON_CACHE_DIR": str(scratch / "triton")}
        return sandbox + argv, inside

    def attempt_env(self, placement: Placement) -> dict[str, str]:
        """The whole environment of an attempt's trainer: the allow-list, the platform's trainer
        variables (no store credential unless TUNEFORGE_TRAINER_STORAGE=direct), its GPUs and node."""
        return child_env({**self.settings.trainer_env(), "TOKENIZERS_PARALLELISM": "false",
                          "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in placement.gpu_ids),
                          "TUNEFORGE_NODE": placement.node})

    def poll(self, handle: dict[str, Any]) -> PollResult:
        if "pid" not in handle:  # launched by another executor (the platform moved): its lease decides
            return PollResult("unknown", detail="launched by another executor")
        pid = int(handle["pid"])
        proc = self._children.get(pid)
        if proc is not None:
            code = proc.poll()
            if code is None:
                return PollResult("running")
            self._children.pop(pid, None)
            return PollResult("exited", code)
        spec_path = handle.get("spec_path", "")
        if _is_our_process(pid, spec_path, handle.get("started")):
            detail = "forked warm" if handle.get("warm") else "adopted from an earlier control plane"
            return PollResult("running", detail=detail)
        code = read_exit_file(spec_path)
        if code is not None:  # launched by an earlier control plane; the trainer left its exit code
            return PollResult("exited", code)
        return PollResult("unknown", None, "process not found (exit code unknown)")

    def signal(self, handle: dict[str, Any], action: Literal["preempt", "cancel"]) -> None:
        if "pid" not in handle:
            return
        pid = int(handle["pid"])
        if pid not in self._children and not _is_our_process(pid, handle.get("spec_path", ""), handle.get("started")):
            return
        sig = signals.SIGTERM if action == "preempt" else signals.SIGKILL
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        if action == "preempt":  # the trainer has the grace period to checkpoint and exit; then it is killed
            timer = threading.Timer(self.settings.preempt_grace_s, self._kill_if_still_there,
                                    (pid, handle.get("spec_path", ""), handle.get("started")))
            timer.daemon = True
            timer.start()

    def _kill_if_still_there(self, pid: int, spec_path: str, started: str | None = None) -> None:
        proc = self._children.get(pid)
        alive = proc.poll() is None if proc is not None else _is_our_process(pid, spec_path, started)
        if alive:
            try:
                os.killpg(pid, signals.SIGKILL)
            except ProcessLookupError:
                pass

    def release(self, handle: dict[str, Any]) -> None:
        """Nothing to free: an exited process holds nothing, and slots are the database's."""

    def reap(self, active: set[tuple[str, int]]) -> list[str]:
        return []

    def close(self) -> None:
        """Trainers run in their own sessions and outlive the control plane on purpose."""

    def log_tail(self, handle: dict[str, Any], max_bytes: int = 4000) -> str:
        path = Path(handle.get("log_path", ""))
        if not path.is_file():
            return ""
        with open(path, "rb") as log:
            log.seek(max(0, path.stat().st_size - max_bytes))
            return log.read().decode("utf-8", "replace")


def _code_under_tmp() -> list[str]:
    """Read-only binds, inside the namespace's own /tmp, of the folders the trainer imports from that
    lie under the host's /tmp (a checkout installed in place there, as CI runs the tests): the
    namespace hides the rest of the host's /tmp."""
    import tuneforge

    tmp = Path("/tmp").resolve()
    folders = {Path(entry).resolve() for entry in (*sys.path, *os.environ.get("PYTHONPATH", "").split(os.pathsep))
               if entry}
    folders.add(Path(tuneforge.__file__).resolve().parents[1])
    binds: list[str] = []
    for folder in sorted(folders):
        if folder.is_dir() and folder != tmp and folder.is_relative_to(tmp):
            binds += ["--ro-bind", str(folder), str(folder)]
    return binds

def _is_our_process(pid: int, spec_path: str, started: str | None = None) -> bool:
    """Whether `pid` is still the trainer of this handle: the same start time for a trainer forked
    warm (its command line is the warm trainer's), else its command line names its spec."""
    if started is not None:
        return process_start_time(pid) == started
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode("utf-8", "replace")
    except OSError:
        return False
    return bool(spec_path) and spec_path in cmdline and "tuneforge.train" in cmdline
