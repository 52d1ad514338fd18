"""The state of one attempt while the loop (`train/loop.py`) runs it."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from tuneforge.domain.spec import JobSpec
from tuneforge.storage.store import ObjectStore
from tuneforge.train import distributed
from tuneforge.train.hooks import NO_HOOKS, Hooks
from tuneforge.train.reporter import Reporter

if TYPE_CHECKING:
    from tuneforge.train.objective import Objective


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
    train_set: list[Any]
    valid_set: list[Any]
    device: torch.device
    total_steps: int
    objective: "Objective"
    dist: distributed.Dist = field(default_factory=distributed.Dist)
    fused_loss: str = "off"  # how token losses are computed (train/fused_loss.py): off, chunked or liger
    hooks: Hooks = NO_HOOKS
    state: TrainerState = field(default_factory=TrainerState)
    last_checkpoint_step: int = -1
    last_checkpoint_time: float = field(default_factory=time.monotonic)
    epoch_cache: tuple[int, list[int]] = (-1, [])
    trackers: Any = None  # the job's experiment trackers (train/tracking.py); rank 0's, else none

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

    @property
    def padding_fraction(self) -> float:
        return 1.0 - self.num_tokens / self.num_slots if self.num_slots else 0.0


class StepAbandoned(Exception):
    """A preemption notice came mid-step and the step cannot finish within the grace period."""
