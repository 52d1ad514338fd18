"""Cost estimate of a job before it runs: tokens, steps, GPU-hours, price, queue position.

Runtime comes from a FLOP count: training a token costs about 6 x N FLOPs for a
full fine-tune and about 4 x N with LoRA (no weight gradients for the frozen
base), N the base model's parameters; a GPU sustains
`TUNEFORGE_GPU_EFFECTIVE_TFLOPS`. Measured throughput replaces this once the
scheduler records it.
"""

from __future__ import annotations

import math

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from tuneforge.db.tables import BaseModelRow, Job
from tuneforge.domain.resolved import Estimate
from tuneforge.domain.status import JobStatus
from tuneforge.settings import Settings

FLOPS_PER_TOKEN_PER_PARAM = {"lora": 4.0, "qlora": 4.0, "full": 6.0}
MIN_RUNTIME_S = 60.0  # start-up, model load and saving, whatever the data size


def queue_position(session: Session, job: Job | None = None) -> int:
    """1-based position among jobs waiting to run (first-in first-out)."""
    waiting = [JobStatus.QUEUED.value, JobStatus.VALIDATING_FILES.value]
    stmt = select(func.count()).select_from(Job).where(Job.status.in_(waiting))
    if job is not None:
        stmt = stmt.where(Job.pk < job.pk)
    return int(session.scalar(stmt) or 0) + 1


def estimate(settings: Settings, base: BaseModelRow, *, train_tokens_per_epoch: int, train_examples: int,
             n_epochs: int, batch_size: int, training_type: str, gpus: int = 1) -> Estimate:
    training_tokens = train_tokens_per_epoch * n_epochs
    steps = n_epochs * math.ceil(train_examples / max(1, batch_size))
    params = base.num_parameters or base.size_bytes // 2
    flops = FLOPS_PER_TOKEN_PER_PARAM.get(training_type, 6.0) * params * training_tokens
    runtime_s = max(MIN_RUNTIME_S, flops / (settings.gpu_effective_tflops * 1e12 * max(1, gpus)))
    gpu_hours = runtime_s * max(1, gpus) / 3600
    gpu_type = settings.gpu_type
    table = settings.price_per_gpu_hour
    unit_price = table.get(gpu_type, table.get("default", 0.0))
    return Estimate(
        training_tokens=training_tokens,
        train_examples=train_examples,
        steps=steps,
        estimated_runtime_seconds=round(runtime_s, 1),
        estimated_gpu_hours=round(gpu_hours, 4),
        gpu_type=gpu_type,
        gpus=gpus,
        price_per_gpu_hour=unit_price,
        estimated_price=round(gpu_hours * unit_price, 4),
        currency=settings.price_currency,
    )
