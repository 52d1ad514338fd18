"""Training over several processes: one per GPU (NCCL), or per logical slot on a CPU host
(gloo), in torch's standard layout.

Processes and their environment are torchrun's: `RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
`LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`; the group is joined with
`init_method="env://"`. Three launchers set them:

- the local executor starts rank 0 only (`python -m tuneforge.train SPEC`); with
  `spec.gpus > 1` and no `WORLD_SIZE` in its environment it starts ranks 1..N-1 itself
  (`launch_workers`, in its own process group, so a preemption notice or a kill reaches
  them all): forked from rank 0, which has imported torch, transformers and peft already
  (seconds of CPU a fresh process would spend again), when that is safe — no Python thread
  but the main one, CUDA not initialised, no tensor op run yet — else as the same command;
- the Ray executor's actor on every node starts that node's ranks, each told its rank,
  its local rank (its GPU on the node) and rank 0's address and port;
- an operator may run `torchrun --nproc-per-node N -m tuneforge.train SPEC` by hand.

Rank 0 alone reports to the control plane, writes the artifacts and leaves the exit code;
the others only train. Checkpoints are written by every rank together
(`train/checkpoint.py`, torch.distributed.checkpoint).

Strategies (`spec.distributed_strategy`, chosen by the planner or the tenant):

- `ddp`: torch `DistributedDataParallel`. Every rank holds the whole model; gradients
  are all-reduced in buckets during the backward pass of a step's last micro-batch.
  For adapters (LoRA, QLoRA) whose base fits one GPU.
- `fsdp`: FSDP2 (`torch.distributed.fsdp.fully_shard`): each decoder layer, then the
  rest of the model, is sharded over the ranks: weights, gradients and optimizer states
  are 1/N a rank; a layer's weights are gathered whole just for its forward and
  backward. For full fine-tunes and bases larger than one GPU. QLoRA cannot be sharded
  (bitsandbytes' 4-bit weights are not DTensors): refused when the job is created.

How a step is shared: every rank knows the step's examples (the epoch order is a pure
function of the seed) and takes every N-th of them. Every rank runs the same number of
micro-batches (a rank with fewer runs a filler whose loss counts zero), because both
strategies communicate inside the forward or backward pass. Each rank scales its loss by
N / (units of the whole step): both strategies average gradients over the ranks, so the
result is the gradient of the whole step as one process would compute it. Decisions that
must be unanimous — stop now, checkpoint now — are reduced with `any`.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NoReturn

import torch
import torch.distributed as torch_dist

from tuneforge.domain.exit_codes import TrainerExit
from tuneforge.domain.rendezvous import (  # noqa: F401 - RENDEZVOUS_ENV, rendezvous_env: re-exported
    ADDR_ENV,
    LOCAL_RANK_ENV,
    PORT_ENV,
    RANK_ENV,
    RENDEZVOUS_ENV,
    WORLD_ENV,
    rendezvous_env,
)
from tuneforge.security.env import child_env

log = logging.getLogger(__name__)

JOIN_TIMEOUT = datetime.timedelta(minutes=10)


def rank_from_env() -> tuple[int, int]:
    return int(os.environ.get(RANK_ENV, "0")), int(os.environ.get(WORLD_ENV, "1"))


def local_rank_from_env() -> int:
    return int(os.environ.get(LOCAL_RANK_ENV) or os.environ.get(RANK_ENV, "0"))


def default_strategy(training_type: str) -> str:
    """A spec without a strategy (written before there was a choice): shard full fine-tunes."""
    return "fsdp" if training_type == "full" else "ddp"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_workers(spec_path: str, world: int) -> list[subprocess.Popen | ForkedRank]:
    """From rank 0, before any tensor op: start ranks 1..world-1 on this host and set rank 0's
    own environment."""
    port = _free_port()
    os.environ.update(rendezvous_env(0, world, 0, world, "127.0.0.1", port))
    fork = fork_safe()
    workers: list[subprocess.Popen | ForkedRank] = []
    for rank in range(1, world):
        # the allow-list again, plus the platform's own TUNEFORGE_* variables rank 0's executor set
        # (store, egress, node): nothing else rank 0 inherited reaches the other ranks
        platform_vars = {name: value for name, value in os.environ.items() if name.startswith("TUNEFORGE_")}
        env = child_env({**platform_vars, **rendezvous_env(rank, world, rank, world, "127.0.0.1", port)})
        if fork:
            workers.append(ForkedRank.start(spec_path, env))
        else:
            workers.append(subprocess.Popen([sys.executable, "-m", "tuneforge.train", spec_path], env=env,
                                            stdin=subprocess.DEVNULL))
    return workers


def fork_safe() -> bool:
    """Whether this process may fork a trainer: it runs no Python thread but this one and has not
    initialised CUDA (a forked child could not use it). The caller also knows that no tensor op
    has run (the CPU thread pool a child would inherit half of does not exist yet)."""
    return threading.active_count() == 1 and not torch.cuda.is_initialized()


class ForkedRank:
    """A worker rank forked from rank 0: the part of `subprocess.Popen` that `stop_workers` uses."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    @classmethod
    def start(cls, spec_path: str, env: dict[str, str]) -> ForkedRank:
        for stream in (sys.stdout, sys.stderr):  # what is buffered is written once, not once per process
            stream.flush()
        # SIGTERM stays blocked in the child until the trainer's own handler is in place (`__main__.main`
        # unblocks it): a notice sent while the rank starts is not lost, nor taken by rank 0's handler
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            pid = os.fork()
            if pid == 0:
                _become_worker(spec_path, env)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        return cls(pid)

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: its code is lost
                self.returncode = int(TrainerExit.PLATFORM_ERROR)
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"rank process {self.pid}", timeout or 0.0)
            time.sleep(0.05)
        return code

    def kill(self) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


def _become_worker(spec_path: str, env: dict[str, str]) -> NoReturn:
    """In the forked child: run as the worker rank a fresh `python -m tuneforge.train SPEC` with
    `env` would be (stdin empty, stdout and stderr rank 0's), then exit with its code."""
    from tuneforge.train.__main__ import run_forked

    def prepare() -> None:
        null_fd = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null_fd, 0)
        os.close(null_fd)

    run_forked(spec_path, env, prepare)


def stop_workers(workers: list[subprocess.Popen | ForkedRank], timeout_s: float = 60.0) -> None:
    for worker in workers:
        try:
            worker.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("rank process %d did not exit; killing it", worker.pid)
            worker.kill()
            worker.wait()


def _parallel_model_class() -> type:
    from torch.nn.parallel import DistributedDataParallel

    class ParallelModel(DistributedDataParallel):
        """DDP whose wrapped model's attributes (config, generate, disable_adapter, ...) stay
        reachable, so the objectives read `run.model` the same with or without it."""

        def __getattr__(self, name: str) -> Any:
            try:
                return super().__getattr__(name)
            except AttributeError:
                return getattr(self.module, name)

    return ParallelModel


def unwrap(model: Any) -> Any:
    """The model a DDP wrapper holds (the model itself otherwise): what checkpoints and
    artifacts read."""
    from torch.nn.parallel import DistributedDataParallel

    return model.module if isinstance(model, DistributedDataParallel) else model


def is_sharded(model: Any) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def _layer_classes(model: torch.nn.Module) -> set[str]:
    """Class names of the model's repeated blocks (transformers' `_no_split_modules`)."""
    for module in model.modules():
        names = getattr(module, "_no_split_modules", None)
        if names:
            return set(names)
    return set()


def _has_experts(model: torch.nn.Module) -> bool:
    config = getattr(model, "config", None)
    return any(getattr(config, name, 0) for name in ("num_experts", "num_local_experts", "n_routed_experts"))


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    strategy: str = ""
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    _joined: bool = field(default=False, repr=False)

    @property
    def enabled(self) -> bool:
        return self.world > 1 or self._joined  # (a group of one: FSDP2 on one GPU, `join(shard_alone=...)`)

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def sharded(self) -> bool:
        return self.enabled and self.strategy == "fsdp"

    @property
    def loss_scale(self) -> float:
        """What each rank multiplies its loss by: the strategies average gradients over the ranks."""
        return float(self.world) if self.enabled else 1.0

    def share(self, items: list[Any]) -> list[Any]:
        """This rank's part of a step: every world-th item, from its rank on."""
        return items[self.rank::self.world] if self.enabled else items

    def sum(self, values: list[float]) -> list[float]:
        if not self.enabled:
            return values
        tensor = torch.tensor(values, dtype=torch.float64, device=self._comm_device)
        torch_dist.all_reduce(tensor, op=torch_dist.ReduceOp.SUM)
        return tensor.tolist()

    def max(self, value: int) -> int:
        if not self.enabled:
            return value
        tensor = torch.tensor([value], dtype=torch.int64, device=self._comm_device)
        torch_dist.all_reduce(tensor, op=torch_dist.ReduceOp.MAX)
        return int(tensor.item())

    def any(self, flag: bool) -> bool:
        return bool(self.max(1 if flag else 0))

    @property
    def _comm_device(self) -> torch.device:
        return self.device if self.device.type == "cuda" else torch.device("cpu")

    def gather(self, obj: Any) -> list[Any]:
        if not self.enabled:
            return [obj]
        out: list[Any] = [None] * self.world
        torch_dist.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank."""
        if not self.enabled:
            return obj
        box = [obj]
        torch_dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.enabled:
            torch_dist.barrier()

    def close(self) -> None:
        if self._joined and torch_dist.is_initialized():
            torch_dist.destroy_process_group()

    # -- the model -------------------------------------------------------------------

    def wrap(self, model: Any) -> Any:
        """The model as this attempt's strategy trains it: as is alone, under DDP, or sharded."""
        if not self.enabled:
            return model
        if self.strategy == "fsdp":
            return self._shard(model)
        cls = _parallel_model_class()
        device_ids = [self.device.index or 0] if self.device.type == "cuda" else None
        # MoE: experts no token of this micro-batch was routed to have no gradient
        # gradients live in DDP's communication buckets: no second copy of them
        return cls(model, device_ids=device_ids, broadcast_buffers=False, gradient_as_bucket_view=True,
                   find_unused_parameters=_has_experts(model))

    def _shard(self, model: Any) -> Any:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(self.device.type, (self.world,))
        blocks = _layer_classes(model)
        layers = [module for module in model.modules() if type(module).__name__ in blocks]
        if not layers:
            log.warning("no repeated blocks found: the model is sharded as one unit")
        for layer in layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        log.info("sharded %d layers and the rest of the model over %d ranks (FSDP2)", len(layers), self.world)
        return model

    def reshard(self, model: Any) -> None:
        """Put a sharded model's layers back to their shards: after a forward pass without
        gradients (a check, a validation) FSDP keeps the outermost unit gathered, and the
        optimizer and checkpoints know the parameters by their sharded form."""
        if not self.sharded:
            return
        from torch.distributed.fsdp import FSDPModule

        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.reshard()

    @contextlib.contextmanager
    def accumulating(self, model: Any, last: bool) -> Iterator[None]:
        """Around one micro-batch's forward and backward: gradients are only exchanged with
        the step's last one."""
        if not self.enabled or last:
            yield
            return
        if self.sharded:
            model.set_requires_gradient_sync(False)
            try:
                yield
            finally:
                model.set_requires_gradient_sync(True)
            return
        with model.no_sync():
            yield

    def clip_grad_norm(self, params: list[torch.nn.Parameter], max_norm: float) -> float:
        """The gradient norm of the whole model, before clipping to `max_norm` (sharded
        gradients: over every rank's shard)."""
        grads = [param.grad for param in params if param.grad is not None]
        if not grads:
            return 0.0
        total = torch.nn.utils.get_total_norm(grads)
        if hasattr(total, "full_tensor"):  # a DTensor: the shards' partial norms, reduced
            total = total.full_tensor()
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
        return float(total)

    def full_state(self, model: Any, *, trainable_only: bool) -> dict[str, torch.Tensor]:
        """The model's weights whole, on the CPU, on rank 0 ({} on the others); sharded
        weights are gathered, which every rank must call for."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        if self.sharded:
            options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=trainable_only)
            state = get_model_state_dict(model, options=options)
            return state if self.main else {}
        if not self.main:
            return {}
        inner = unwrap(model)
        names = {name for name, param in inner.named_parameters() if param.requires_grad} if trainable_only else None
        return {name: tensor.detach().cpu() for name, tensor in inner.state_dict().items()
                if names is None or name in names}


def join(device: torch.device, strategy: str = "", *, shard_alone: bool = False) -> Dist:
    """Join the process group this process was started into (no-op alone). `shard_alone`: a lone
    process still joins a group of one and shards with FSDP2 (the GPU check runs FSDP2's code
    path on one GPU so; the planner never gives a one-GPU job a strategy)."""
    rank, world = rank_from_env()
    if world <= 1 and not (shard_alone and strategy == "fsdp"):
        return Dist(device=device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    os.environ.setdefault(ADDR_ENV, "127.0.0.1")
    if world <= 1:
        os.environ.setdefault(PORT_ENV, str(_free_port()))
    torch_dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world, timeout=JOIN_TIMEOUT)
    log.info("rank %d of %d joined (%s, %s)", rank, world, backend, strategy or "ddp")
    return Dist(rank, world, strategy or "ddp", device, _joined=True)
