"""The executor protocol: capacity / launch / poll / signal.

The scheduler decides what runs where; an executor only carries it out and
reports what happened. Handles are JSON-able dicts stored with the attempt, so
a restarted control plane can still poll and signal what it launched before.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from tuneforge.domain.spec import JobSpec


@dataclass(frozen=True)
class NodeCapacity:
    name: str
    total_gpus: int
    free_gpus: int
    pool: str = ""  # its capacity pool, when the executor can tell (a Ray node's label); else from the settings
    draining: bool = False  # being drained (a spot reclaim, a scale-down): nothing new starts there, and
    # what runs there checkpoints and moves
    gpu_model: str = ""  # its GPUs' model, e.g. "NVIDIA A100-SXM4-80GB" ("": unknown; placement accepts any type)
    gpu_memory_gb: float = 0.0  # memory of one of its GPUs in GiB (0: unknown; placement accepts any need)
    interconnect: str = ""  # how its GPUs talk, e.g. "nvlink" or "pcie" ("": unknown); reported, not matched


@dataclass(frozen=True)
class Capacity:
    nodes: list[NodeCapacity]

    @property
    def total_gpus(self) -> int:
        return sum(node.total_gpus for node in self.nodes)


@dataclass(frozen=True)
class Placement:
    """Where an attempt runs: `node` and its `gpu_ids`; a multi-node job also
    lists every node it spans in `spans` (node -> GPU ids, `node` included)."""

    node: str
    gpu_ids: list[int] = field(default_factory=list)
    spans: dict[str, list[int]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "gpu_ids": list(self.gpu_ids),
                "spans": {name: list(ids) for name, ids in (self.spans or {self.node: self.gpu_ids}).items()}}

    @classmethod
    def from_assignment(cls, assignment: dict[str, tuple[int, ...]]) -> Placement:
        first = sorted(assignment)[0]
        return cls(first, list(assignment[first]), {name: list(ids) for name, ids in assignment.items()})


@dataclass(frozen=True)
class PollResult:
    """`running`; `exited` with the trainer's exit code; `lost`: known to be gone without
    an exit code (its node died), so the lease need not run out first; `unknown`: cannot
    tell now (the scheduler trusts the lease)."""

    state: Literal["running", "exited", "lost", "unknown"]
    exit_code: int | None = None
    detail: str = ""


class Executor(Protocol):
    def capacity(self) -> Capacity: ...
    def launch(self, spec: JobSpec, placement: Placement) -> dict[str, Any]: ...
    def poll(self, handle: dict[str, Any]) -> PollResult: ...
    def signal(self, handle: dict[str, Any], action: Literal["preempt", "cancel"]) -> None: ...
    def log_tail(self, handle: dict[str, Any], max_bytes: int = 4000) -> str: ...

    def prepare(self) -> None:
        """Get ready to launch (the local executor starts its warm trainer); called when this
        process starts scheduling, so that the first attempts after a start or a takeover do not
        wait for a trainer's imports."""

    def release(self, handle: dict[str, Any]) -> None:
        """Free what an ended attempt still holds (processes, reserved GPUs); called once its
        end is recorded, and safe to call again."""

    def reap(self, active: set[tuple[str, int]]) -> list[str]:
        """Free what this executor holds for attempts other than `active` (job id, attempt
        number) — left behind when a control plane died between an attempt's end and its
        release. Returns what was freed."""

    def close(self) -> None:
        """Disconnect (the control plane is stopping); running attempts carry on."""
