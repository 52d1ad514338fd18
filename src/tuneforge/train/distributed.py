"""Data-parallel training over several processes: one per GPU (NCCL), or per
logical slot on a CPU host (gloo).

An attempt with `spec.gpus > 1` under the local executor starts as one
process, rank 0, the one the executor launched. It starts ranks 1..N-1 (`launch_workers`: the same
`python -m tuneforge.train SPEC`, told their rank through the environment,
in the same process group, so a preemption notice or a kill reaches them
all), then every rank joins the group (`join`). Rank 0 alone reports to the
control plane, writes checkpoints and artifacts and leaves the exit code;
the others only train.

Under the Ray executor every node's actor starts that node's ranks itself,
each told its rank, its local rank (its GPU on the node) and rank 0's address
and port (`TUNEFORGE_DIST_ADDR`, on another node for a multi-node attempt);
rank 0 then starts no workers of its own.

How a step is shared: every rank knows the step's examples (the epoch order
is a pure function of the seed), takes every N-th of them, and scales its
loss by the units (target tokens, pairs) of the whole step. Gradients are
summed over the ranks (`all_reduce_gradients`) before clipping, so every rank
applies the same update to the same weights, and the result is the gradient
of the whole step as one process would compute it. Decisions that must be
unanimous — stop now, checkpoint now — are reduced with `any`; each rank's
RNG state (dropout) goes into the checkpoint, so a resumed group continues
exactly.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as torch_dist

from tuneforge.security.env import child_env

log = logging.getLogger(__name__)

RANK_ENV = "TUNEFORGE_RANK"
WORLD_ENV = "TUNEFORGE_WORLD_SIZE"
LOCAL_RANK_ENV = "TUNEFORGE_LOCAL_RANK"  # the rank's GPU among its node's; default: the rank
ADDR_ENV = "TUNEFORGE_DIST_ADDR"  # rank 0's address (another node's in a multi-node attempt)
PORT_ENV = "TUNEFORGE_DIST_PORT"
JOIN_TIMEOUT = datetime.timedelta(minutes=10)


def rank_from_env() -> tuple[int, int]:
    return int(os.environ.get(RANK_ENV, "0")), int(os.environ.get(WORLD_ENV, "1"))


def local_rank_from_env() -> int:
    return int(os.environ.get(LOCAL_RANK_ENV) or os.environ.get(RANK_ENV, "0"))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_workers(spec_path: str, world: int) -> list[subprocess.Popen]:
    """From rank 0: start ranks 1..world-1 and set rank 0's own environment."""
    port = str(_free_port())
    os.environ.update({RANK_ENV: "0", WORLD_ENV: str(world), PORT_ENV: port})
    workers = []
    for rank in range(1, world):
        # the allow-list again, plus the platform's own TUNEFORGE_* variables rank 0's executor set
        # (store, egress, node, rendezvous): nothing else rank 0 inherited reaches the other ranks
        platform_vars = {name: value for name, value in os.environ.items() if name.startswith("TUNEFORGE_")}
        env = child_env({**platform_vars, RANK_ENV: str(rank), WORLD_ENV: str(world), PORT_ENV: port})
        workers.append(subprocess.Popen([sys.executable, "-m", "tuneforge.train", spec_path], env=env,
                                        stdin=subprocess.DEVNULL))
    return workers


def stop_workers(workers: list[subprocess.Popen], timeout_s: float = 60.0) -> None:
    for worker in workers:
        try:
            worker.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("rank process %d did not exit; killing it", worker.pid)
            worker.kill()
            worker.wait()


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    _joined: bool = field(default=False, repr=False)

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    def share(self, items: list[Any]) -> list[Any]:
        """This rank's part of a step: every world-th item, from its rank on."""
        return items[self.rank::self.world] if self.enabled else items

    def sum(self, values: list[float]) -> list[float]:
        if not self.enabled:
            return values
        tensor = torch.tensor(values, dtype=torch.float64)
        torch_dist.all_reduce(tensor, op=torch_dist.ReduceOp.SUM)
        return tensor.tolist()

    def any(self, flag: bool) -> bool:
        if not self.enabled:
            return flag
        tensor = torch.tensor([1 if flag else 0], dtype=torch.int64)
        torch_dist.all_reduce(tensor, op=torch_dist.ReduceOp.MAX)
        return bool(tensor.item())

    def all_reduce_gradients(self, params: list[torch.nn.Parameter]) -> None:
        """Sum every gradient over the ranks, in one flat buffer (a rank that had no
        example this step contributes zeros)."""
        if not self.enabled:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1).to(torch.float32) for g in grads])
        torch_dist.all_reduce(flat, op=torch_dist.ReduceOp.SUM)
        offset = 0
        for param, grad in zip(params, grads):
            size = grad.numel()
            param.grad = flat[offset:offset + size].view_as(param).to(param.dtype)
            offset += size

    def gather(self, obj: Any) -> list[Any]:
        if not self.enabled:
            return [obj]
        out: list[Any] = [None] * self.world
        torch_dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.enabled:
            torch_dist.barrier()

    def close(self) -> None:
        if self._joined and torch_dist.is_initialized():
            torch_dist.destroy_process_group()


def join(device: torch.device) -> Dist:
    """Join the process group this process was started into (no-op alone)."""
    rank, world = rank_from_env()
    if world <= 1:
        return Dist()
    backend = "nccl" if device.type == "cuda" else "gloo"
    address = os.environ.get(ADDR_ENV) or "127.0.0.1"
    torch_dist.init_process_group(
        backend, init_method=f"tcp://{address}:{os.environ[PORT_ENV]}", rank=rank, world_size=world,
        timeout=JOIN_TIMEOUT)
    log.info("rank %d of %d joined (%s)", rank, world, backend)
    return Dist(rank, world, _joined=True)
