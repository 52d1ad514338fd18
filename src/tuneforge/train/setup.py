"""Process set-up every recipe shares: seeds, the device, CPU threads and the
learning-rate schedule."""

from __future__ import annotations

import math
import os
import random

import numpy as np
import torch

from tuneforge.domain.spec import Hyperparameters

LR_SCHEDULES = ("linear", "cosine", "constant")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def pick_device(gpus: int, local_rank: int = 0) -> torch.device:
    """The rank's GPU among those visible on its node, or the CPU."""
    return torch.device("cuda", local_rank) if gpus > 0 and torch.cuda.is_available() else torch.device("cpu")


# Below this size an op is too small to split across threads: one thread runs
# faster, and on a shared host it cannot be slowed down by spinning siblings.
MULTITHREAD_MIN_PARAMS = 20_000_000


def configure_threads(device: torch.device, num_params: int, requested: int | None = None) -> int:
    """CPU intra-op threads: `requested` (spec.cpu_threads) or a size-based choice.

    A model large enough to profit gets one thread per core of the affinity set
    (the executor confines an attempt with CPU affinity, so that set, not the
    machine, is what the attempt owns). The choice depends only on the model
    and the affinity, so every attempt of a job makes the same one, which exact
    resume on CPU needs.
    """
    if device.type != "cpu":
        return torch.get_num_threads()
    if requested:
        threads = int(requested)
    elif num_params < MULTITHREAD_MIN_PARAMS:
        threads = 1
    else:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        threads = cores or 1
    torch.set_num_threads(max(1, threads))
    return torch.get_num_threads()


def lr_schedule(hp: Hyperparameters, total_steps: int):
    """Factor of the peak learning rate at each 0-based step: warmup, then the decay."""
    warmup_steps = math.ceil(hp.warmup_ratio * total_steps)
    decay_steps = max(1, total_steps - warmup_steps)
    kind = hp.lr_scheduler_type

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps  # the first step already learns
        if kind == "constant":
            return 1.0
        progress = min(1.0, (step - warmup_steps) / decay_steps)
        if kind == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        return 1.0 - progress

    return factor
