"""The state of one attempt while the loop (`train/loop.py`) runs it."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from tuneforge.domain.metrics import check_metric_names
from tuneforge.domain.spec import JobSpec
from tuneforge.storage.store import ObjectStore
from tuneforge.train import distributed
from tuneforge.train.hooks import NO_HOOKS, Hooks
from tuneforge.train.reporter import Reporter

if TYPE_CHECKING:
    from tuneforge.train.objective import Objective, Scores


@dataclass
class TrainerState:
    """What `trainer_state.json` in a checkpoint holds."""

    step: int = 0  # optimizer steps done
    epoch: int = 0  # epoch the next batch comes from
    index_in_epoch: int = 0  # examples of that epoch's order already trained on
    trained_tokens: int = 0  # real tokens fed to the model, every epoch counted
    num_examples: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)  # one row per step
    loss_ema: float | None = None  # smoothed train loss (divergence guard)
    best_loss: float | None = None  # lowest smoothed train loss so far
    bad_steps: int = 0  # steps in a row far above best_loss


@dataclass
class Run:
    spec: JobSpec
    store: ObjectStore
    reporter: Reporter
    stop: threading.Event
    model: Any
    tokenizer: Any
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    params: list[torch.nn.Parameter]
    train_set: Sequence[Any]  # a list, or token shards on disk (train/token_shards.py)
    valid_set: Sequence[Any]
    device: torch.device
    total_steps: int
    objective: Objective
    dist: distributed.Dist = field(default_factory=distributed.Dist)
    fused_loss: str = "off"  # how token losses are computed (train/fused_loss.py): off, chunked or liger
    hooks: Hooks = NO_HOOKS
    state: TrainerState = field(default_factory=TrainerState)
    last_checkpoint_step: int = -1
    last_checkpoint_time: float = field(default_factory=time.monotonic)
    epoch_cache: tuple[int, Any] = (-1, [])  # (epoch, its order: batches.epoch_order)
    trackers: Any = None  # the job's experiment trackers (train/tracking.py); rank 0's, else none
    gpu: Any = None  # this rank's GPU readings (train/gpu_telemetry.GpuSampler); none without NVML
    slowdown: Any = None  # the tokens/s watch that names a slow spell's cause (gpu_telemetry.SlowdownWatch)

    @property
    def num_parameters(self) -> int:
        return self.model.num_parameters()


@dataclass(frozen=True)
class StepMark:
    """Where a step starts: enough to undo it."""

    epoch: int
    index_in_epoch: int
    rng: dict[str, Any]


@dataclass(frozen=True)
class StepStats:
    train_loss: float
    train_accuracy: float
    grad_norm: float
    learning_rate: float
    num_tokens: int
    elapsed_s: float
    num_slots: int = 0  # tokens computed, padding included
    metrics: Mapping[str, float] = field(default_factory=dict)  # the objective's own (`Scores.metrics`)

    @property
    def padding_fraction(self) -> float:
        return 1.0 - self.num_tokens / self.num_slots if self.num_slots else 0.0


@dataclass
class StepTotals:
    """A step's scores summed over its micro-batches (and then over the ranks)."""

    loss_sum: float = 0.0
    correct: int = 0
    count: int = 0
    num_tokens: int = 0
    num_slots: int = 0
    metrics: dict[str, float] = field(default_factory=dict)

    def add(self, scores: Scores, *, real: bool) -> None:
        """`real`: a micro-batch of this rank's share (else a filler: it counts zero, but its metric
        names are known, so that every rank sums the same list of figures)."""
        for name, value in scores.metrics.items():
            self.metrics[name] = self.metrics.get(name, 0.0) + (float(value) if real else 0.0)
        if not real:
            return
        self.loss_sum += float(scores.loss_sum.detach())
        self.correct, self.count = self.correct + scores.correct, self.count + scores.count
        self.num_tokens += scores.num_tokens
        self.num_slots += scores.num_slots

    def summed(self, dist: distributed.Dist) -> StepTotals:
        """The totals of every rank (an objective reports the same metric names on each)."""
        names = sorted(self.metrics)
        values = dist.sum([self.loss_sum, self.correct, self.count, self.num_tokens, self.num_slots,
                           *(self.metrics[name] for name in names)])
        by_name = dict(zip(names, values[5:]))
        return StepTotals(values[0], int(values[1]), int(values[2]), int(values[3]), int(values[4]),
                          {name: by_name[name] for name in self.metrics})

    def stats(self, *, grad_norm: float, learning_rate: float, elapsed_s: float) -> StepStats:
        check_metric_names(self.metrics)
        counted = max(1, self.count)
        return StepStats(
            train_loss=self.loss_sum / counted, train_accuracy=self.correct / counted,
            grad_norm=grad_norm, learning_rate=learning_rate, num_tokens=self.num_tokens,
            elapsed_s=elapsed_s, num_slots=self.num_slots,
            metrics={name: total / counted for name, total in self.metrics.items()},
        )


class StepAbandoned(Exception):
    """A preemption notice came mid-step and the step cannot finish within the grace period."""
