"""Cost estimate of a job before it runs: tokens, steps, GPU-hours, price, queue position.

Runtime comes from a FLOP count: training a token costs about 6 x N FLOPs for a
full fine-tune and about 4 x N with LoRA (no weight gradients for the frozen
base), N the base model's parameters; a GPU sustains
`TUNEFORGE_GPU_EFFECTIVE_TFLOPS`. Measured throughput replaces this once the
scheduler records it.

An estimate reads the whole training file (a data pass), so it is bounded for
the operator's sake: answers are cached by content (`EstimateCache`: the files'
SHA-256, the base model's and the request's configuration; an error is cached
like an answer), and the passes a tenant causes are limited (`admitted`): one at
a time per tenant, and `estimates_per_minute`, across the API processes of a
host; beyond either, 429 with Retry-After. A cached answer costs no pass and
counts against nothing. The pass writes nothing to the store.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from tuneforge.db.repos import jobs as job_repo
from tuneforge.db.tables import BaseModelRow, Job
from tuneforge.domain.errors import ApiError, rate_limited
from tuneforge.domain.resolved import Estimate
from tuneforge.domain.status import JobStatus
from tuneforge.settings import Settings

FLOPS_PER_TOKEN_PER_PARAM = {"lora": 4.0, "qlora": 4.0, "full": 6.0}
SAMPLING_FLOPS_PER_TOKEN = 2.0  # a forward pass per sampled (and prefilled) token
MIN_RUNTIME_S = 60.0  # start-up, model load and saving, whatever the data size
ESTIMATE_CACHE_TTL_S = 600.0  # an estimate's figures hold while the files and the queue barely change
ESTIMATE_WINDOW_S = 60.0  # estimates_per_minute is counted over this window
IN_FLIGHT_RETRY_AFTER_S = 2  # a data pass of a small file takes about this long


def queue_position(session: Session, job: Job | None = None) -> int:
    """1-based position among jobs waiting to run (first-in first-out)."""
    waiting = [JobStatus.QUEUED.value, JobStatus.VALIDATING_FILES.value]
    return job_repo.count_waiting_before(session, waiting, None if job is None else job.pk) + 1


def estimate(settings: Settings, base: BaseModelRow, *, train_tokens_per_epoch: int, train_examples: int,
             n_epochs: int, batch_size: int, training_type: str, gpus: int = 1, rollout_group: int = 0,
             completion_tokens: int = 0) -> Estimate:
    """`rollout_group` > 0 (a generating method): each example is `rollout_group` sequences of its prompt
    and up to `completion_tokens` sampled tokens, each sampled (a forward: 2 FLOPs per parameter and
    token) and then trained on."""
    training_tokens = train_tokens_per_epoch * n_epochs
    if rollout_group:
        training_tokens = (train_tokens_per_epoch + train_examples * completion_tokens) * rollout_group * n_epochs
    steps = n_epochs * math.ceil(train_examples / max(1, batch_size))
    params = base.num_parameters or base.size_bytes // 2
    per_token = FLOPS_PER_TOKEN_PER_PARAM.get(training_type, 6.0) + (SAMPLING_FLOPS_PER_TOKEN if rollout_group else 0)
    flops = per_token * params * training_tokens
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


# ---- bounds on estimates ---------------------------------------------------------------------------
def content_key(tenant_id: str, request_json: dict[str, Any], *, training_sha256: str,
                validation_sha256: str | None, base_sha256: str, pii_policy: str | None) -> str:
    """What an estimate depends on: the files' bytes (not their ids), the base weights and the rest of
    the request. The tenant is part of the key: one tenant's answers are never another's."""
    config = {k: v for k, v in request_json.items() if k not in ("training_file", "validation_file")}
    material = {"tenant": tenant_id, "training": training_sha256, "validation": validation_sha256,
                "base": base_sha256, "pii": pii_policy, "request": config}
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()


@dataclass(frozen=True)
class _Entry:
    answer: dict[str, Any] | ApiError
    stored_at: float


class EstimateCache:
    """Estimates (or the error one answered) by `content_key`, least recently used first out,
    each for `ESTIMATE_CACHE_TTL_S`. One per API process."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str, now: float) -> dict[str, Any] | ApiError | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or now - entry.stored_at > ESTIMATE_CACHE_TTL_S:
                self._entries.pop(key, None)
                return None
            self._entries.move_to_end(key)
            return entry.answer

    def put(self, key: str, answer: dict[str, Any] | ApiError, now: float) -> None:
        if self.max_entries <= 0:
            return
        with self._lock:
            self._entries[key] = _Entry(answer, now)
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


_caches: dict[int, EstimateCache] = {}


def cache_for(max_entries: int) -> EstimateCache:
    """This process's cache (one per configured size, so tests with other settings get their own)."""
    return _caches.setdefault(max_entries, EstimateCache(max_entries))


@contextlib.contextmanager
def admitted(home: Path, tenant_id: str, per_minute: int, now: float | None = None) -> Iterator[None]:
    """Run one data pass of an estimate for the tenant, or raise 429: while another of its passes
    runs (on any API process of this host), or once it has had `per_minute` in the last minute.
    The count lives in a file per tenant, read and written under an exclusive lock on it, which
    is also what marks the pass in flight."""
    folder = home / "estimates"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{hashlib.sha256(tenant_id.encode()).hexdigest()[:32]}.json"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise rate_limited("An estimate of yours is being computed; one runs at a time. Retry when it is done.",
                               code="estimate_in_progress", retry_after=IN_FLIGHT_RETRY_AFTER_S) from None
        _count_pass(fd, per_minute, time.time() if now is None else now)
        yield
    finally:
        os.close(fd)  # releases the lock


def _count_pass(fd: int, per_minute: int, now: float) -> None:
    with os.fdopen(os.dup(fd), "r+") as handle:
        try:
            started = [t for t in json.loads(handle.read() or "[]") if now - t < ESTIMATE_WINDOW_S]
        except (ValueError, TypeError):
            started = []  # a torn file: start counting afresh
        if len(started) >= per_minute:
            retry_after = max(1, math.ceil(ESTIMATE_WINDOW_S - (now - min(started))))
            raise rate_limited(f"Too many estimates: {len(started)} in the last {ESTIMATE_WINDOW_S:g} s, the limit is "
                               f"{per_minute}. Repeating an estimate already made is free.",
                               code="estimate_rate_exceeded", retry_after=retry_after)
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps(started + [now]))
