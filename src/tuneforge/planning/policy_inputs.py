"""What the scheduling policy decides on: its configuration, the queued and
running jobs, the nodes and their free GPUs. Plain data; the scheduler loop
builds it from rows and the executor's inventory (`services/training/cluster_state.py`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tuneforge.planning.hardware import GpuAsk

if TYPE_CHECKING:
    from tuneforge.settings import Settings

TIER_RANK = {"premium": 0, "standard": 1, "free": 2}


@dataclass(frozen=True)
class PolicyConfig:
    aging_s: float = 43200.0  # waiting this long is worth one tier (12 h: see docs/benchmarks-scheduler.md)
    fair_share_s_per_gpu_hour: float = 60.0  # each recent GPU-hour of a tenant delays its jobs this much
    fair_share_max_s: float = 1800.0
    target_wait_s: dict[str, float | None] = field(
        default_factory=lambda: {"premium": 300.0, "standard": None, "free": None})
    backfill_depth: int = 500  # queued jobs examined for backfill per tick
    overrun_fraction: float = 0.25  # a running job past its estimated end is expected to need this much more
    min_overrun_s: float = 60.0
    hold_s: float = 600.0  # GPUs freed by preemption stay reserved for their job this long at most
    preemptors_per_tick: int = 4  # jobs that may ask for preemption in one decision

    @classmethod
    def from_settings(cls, settings: Settings) -> PolicyConfig:
        """The policy the operator configured (queue aging, premium's target wait); every other
        knob keeps its default. The scheduler and every view of the queue use this one."""
        return cls(aging_s=settings.scheduler_aging_s,
                   target_wait_s={"premium": settings.premium_target_wait_s, "standard": None, "free": None})


@dataclass(frozen=True)
class QueuedJob:
    job_id: str
    tenant_id: str
    tier: str
    gpus: int
    queued_at: float
    runtime_s: float  # estimated
    gpus_per_node: int = 0  # 0: all on one node; else a multi-node job takes gpus / gpus_per_node nodes
    seq: int = 0  # breaks ties between jobs queued in the same second: arrival order (e.g. the row's key)
    pools: tuple[str, ...] | None = None  # capacity pools it may start on, in order (planning/pools.py); None: any
    hardware: GpuAsk = GpuAsk()  # the GPU type and least memory per GPU it needs (planning/hardware.py); any


@dataclass(frozen=True)
class RunningJob:
    job_id: str
    tenant_id: str
    tier: str
    placement: dict[str, tuple[int, ...]]  # node -> GPU ids
    started_at: float
    expected_end: float
    last_checkpoint_at: float
    progress: float = 0.0  # 0..1
    queued_at: float = 0.0  # where it would rank if requeued (a requeued job keeps its queue time)

    @property
    def gpus(self) -> int:
        return sum(len(ids) for ids in self.placement.values())


@dataclass
class Node:
    name: str
    total: int
    free: set[int]
    pool: str = ""  # the capacity pool it belongs to ("" when pools are not configured)
    gpu_model: str = ""  # its GPUs' model as the executor reports it ("": unknown, matches any type)
    gpu_memory_gb: float = 0.0  # memory of one of its GPUs (0: unknown, fits any job)

    def fits(self, ask: GpuAsk) -> bool:
        """Its GPUs are what the job asks for (planning/hardware.py)."""
        return ask.any or ask.fits(self.gpu_model, self.gpu_memory_gb)


Assignment = dict[str, tuple[int, ...]]  # node -> GPU ids
