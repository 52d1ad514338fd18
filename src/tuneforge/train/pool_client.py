"""A small ordinary job trained as a client of its base model's shared co-training worker.

Planning puts a supervised LoRA job within the operator's pool limits (`pool_jobs_max_*`) on the
shared pool (`resources.shared_pool`); its attempt then holds no GPU and never loads the base to
train. It does everything else an attempt does, the same way (`train/loop.py`): tokenizes its
data, orders its batches by (seed, epoch), reports metrics and events, checkpoints, resumes,
stops on SIGTERM or cancel, guards against divergence. Each step is one request to the worker
(`POST /internal/v1/pools/jobs/{job}/forward_backward`, batched there with every other model's
requests of the cycle) and one optimizer step of its own adapter (`optim_step`: AdamW with the
job's learning-rate schedule, weight decay and gradient clipping) — the control plane's side is
`services/training_api/job_clients.py`.

    a step's rows   one per example, unpacked: tokens = input_ids[:-1], target_tokens =
                    input_ids[1:], weight 1/U on every target token (U: the step's target tokens,
                    as `Objective.units`) and 0 elsewhere; the worker's weighted cross-entropy sum
                    is then the step's mean token loss, the ordinary trainer's objective
    checkpoint      `pool_state.pt` (the worker's adapter and AdamW state: exact resume), the
                    adapter in PEFT's format and `trainer_state.json`, under the job's own
                    checkpoint folder with the usual manifest
    resume          the newest valid checkpoint's state goes back to the worker; the data position,
                    history and guards come from its trainer state; the learning rate is a function
                    of the step: the resumed steps equal the uninterrupted run's
    the end         a last checkpoint, then the base is loaded here once, with the trained adapter,
                    for the artifacts and the evaluation (`loop.save_final`, as any job). This is
                    the one time the attempt holds the base: on the device it was given (CPU when
                    it has no GPU), for the few minutes of the eval.

Token accuracy is not computed on the pool (its pass returns log-probabilities of the targets,
not the argmax): the metrics leave it empty until the final evaluation.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx
import torch

from tuneforge.data.tokenize import IGNORE_INDEX
from tuneforge.domain.exit_codes import TrainerExit
from tuneforge.domain.metrics import checkpoint_metrics
from tuneforge.domain.spec import JobSpec
from tuneforge.storage import layout
from tuneforge.storage.store import ObjectStore
from tuneforge.train import checkpoint as ckpt
from tuneforge.train.errors import AttemptFenced, TrainingDiverged
from tuneforge.train.guards import check_divergence
from tuneforge.train.loop import (
    Validation,
    checkpoint_due,
    ensure_current,
    next_batch,
    publish_step,
    record_validation,
    save_final,
    stop_reason,
)
from tuneforge.train.model import fetch_base_model, load_adapter_weights, load_base_model, prepare_trainable
from tuneforge.train.objective import Objective, token_units
from tuneforge.train.reporter import Reporter, message_event
from tuneforge.train.run import Run, StepStats, TrainerState
from tuneforge.train.setup import lr_schedule, pick_device, seed_everything
from tuneforge.train.tracking import Trackers

log = logging.getLogger(__name__)

POOL_STATE = "pool_state.pt"  # the worker's adapter and optimizer state, as it saves and loads them
VALID_ROWS = 64  # validation rows per forward request
GIVE_UP_S = 600.0  # the pool unreachable (or refusing with 429/503) this long: the attempt fails, and is retried
ADAM = {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8}  # torch's AdamW defaults, as the ordinary trainer uses


class PoolStopped(Exception):
    """The attempt was told to stop (SIGTERM or cancel) while it waited for its model to open."""


class PoolChannel:
    """Requests to the job's model on the shared pool. A request answered `pending` is waited for;
    a transport error, 429 or 503 is retried with the same `seq` (the control plane answers a
    repeated `seq` with the first request's result: a step never runs twice)."""

    def __init__(self, spec: JobSpec, should_stop: Callable[[], bool]) -> None:
        self.url = f"{spec.callback_url.rstrip('/')}/internal/v1/pools/jobs/{spec.job_id}"
        self.should_stop = should_stop
        self.seq = 0
        self.client = httpx.Client(timeout=httpx.Timeout(60.0, connect=10.0),
                                   headers={"Authorization": f"Bearer {spec.job_token}"})

    def call(self, action: str, body: dict[str, Any] | None = None, *, interruptible: bool = False) -> dict[str, Any]:
        self.seq += 1
        request = {**(body or {}), "seq": self.seq}
        path, delay, failing_since = action, 0.5, None
        while True:
            if interruptible and self.should_stop():
                raise PoolStopped()
            problem = None
            try:
                response = self.client.post(f"{self.url}/{path}", json=request)
            except httpx.TransportError as exc:
                problem = f"the control plane is unreachable ({type(exc).__name__})"
            else:
                if response.status_code == 200:
                    answer = response.json()
                    if answer.get("pending"):  # still running (or waiting for the worker): wait on
                        path, request, failing_since, delay = "wait", {"request_id": answer["pending"]}, None, 0.5
                        continue
                    return dict(answer)
                if response.status_code == 401:
                    raise AttemptFenced(f"the pool no longer takes this attempt's requests ({action})")
                if response.status_code in (429, 502, 503, 504):
                    problem = f"the pool answered {response.status_code}"
                    delay = max(delay, float(response.headers.get("retry-after") or delay))
                else:
                    raise RuntimeError(f"the pool refused {action}: HTTP {response.status_code} {response.text[:300]}")
            now = time.monotonic()
            failing_since = failing_since or now
            if now - failing_since > GIVE_UP_S:
                raise RuntimeError(f"{problem} for {GIVE_UP_S:.0f} s ({action})")
            log.warning("%s (%s); retrying in %.1f s", problem, action, delay)
            time.sleep(min(delay, 10.0))
            delay = min(delay * 2, 10.0)

    def close(self) -> None:
        try:
            self.client.post(f"{self.url}/close", json={}, timeout=10.0)
        except httpx.HTTPError:
            log.warning("could not tell the pool this attempt ended; its model is released when idle")
        self.client.close()


def run_on_pool(spec: JobSpec, store: ObjectStore, reporter: Reporter, stop: threading.Event,
                objective: Objective) -> TrainerExit:
    hp = spec.hyperparameters
    seed_everything(spec.seed)
    base_dir = fetch_base_model(store, spec.base_model, Path(spec.cache_dir) if spec.cache_dir else None)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    reporter.report("events", message_event(
        f"attempt {spec.attempt} started on the shared co-training worker of {spec.base_model.name}",
        data={"device": "shared_pool", "base_model": spec.base_model.name, "world_size": 1}))
    sha = spec.base_model.sha256
    train_set = objective.load(store, spec.training_file, tokenizer, hp, label="training", base_model_sha256=sha)
    valid_set = objective.load(store, spec.validation_file, tokenizer, hp, label="validation",
                               base_model_sha256=sha) if spec.validation_file else []
    total_steps = hp.n_epochs * math.ceil(len(train_set) / hp.batch_size)
    run = Run(spec, store, reporter, stop, None, tokenizer, None, None, [], train_set, valid_set,  # type: ignore[arg-type]
              torch.device("cpu"), total_steps, objective=objective)
    run.trackers = Trackers.from_spec(spec, store, reporter)
    run.trackers.start({"method": spec.method, "training_type": spec.training_type, "seed": spec.seed,
                        "shared_pool": True, **hp.flat(), **{f"lora_{k}": v for k, v in asdict(spec.lora).items()}})
    channel = PoolChannel(spec, lambda: stop.is_set() or reporter.stop_requested)
    try:
        try:
            run.state = _open(run, channel)
        except PoolStopped:
            reporter.report("events", message_event("stopped before the first step: the shared worker had not "
                                                    "opened the model yet", level="warn"))
            return TrainerExit.PREEMPTED
        schedule = lr_schedule(hp, total_steps)
        while run.state.step < run.total_steps:
            if reason := stop_reason(run):
                return _stop_early(run, channel, reason)
            ensure_current(run)
            _finish_step(run, channel, _step(run, channel, next_batch(run), schedule))
        return _final(run, channel, base_dir)
    finally:
        channel.close()
        if run.trackers is not None:
            run.trackers.finish({}, succeeded=False)


def _open(run: Run, channel: PoolChannel) -> TrainerState:
    """The job's model on the pool: from its newest valid checkpoint, or fresh."""
    spec = run.spec
    root = layout.checkpoints_prefix(spec.tenant_id, spec.job_id)
    found = ckpt.latest_valid_checkpoint(run.store, root)
    if found is None or POOL_STATE not in found.files:
        channel.call("open", {}, interruptible=True)
        return TrainerState(num_examples=len(run.train_set))
    channel.call("open", {"state": base64.b64encode(found.files[POOL_STATE]).decode()}, interruptible=True)
    state = TrainerState(**json.loads(found.files[ckpt.TRAINER_STATE]))
    if state.num_examples != len(run.train_set):
        raise RuntimeError(f"checkpoint {found.prefix} was trained on {state.num_examples} examples, "
                           f"the training file now has {len(run.train_set)}")
    ckpt.delete_checkpoints_after(run.store, root, found.step)
    run.last_checkpoint_step = found.step
    run.reporter.report("events", message_event(f"resumed from the checkpoint at step {found.step}",
                                                data={"step": found.step, "prefix": found.prefix}))
    run.reporter.report("resumed", {"step": found.step, "prefix": found.prefix, "total_steps": run.total_steps})
    return state


def _rows(examples: list[Any], units: int) -> list[dict[str, Any]]:
    """One row per example: predict input_ids[1:] from input_ids[:-1], each target token weighted 1/units."""
    weight = 1.0 / max(1, units)
    return [{"tokens": list(example.input_ids[:-1]), "target_tokens": list(example.input_ids[1:]),
             "weights": [weight if label != IGNORE_INDEX else 0.0 for label in example.labels[1:]]}
            for example in examples]


def _step(run: Run, channel: PoolChannel, indices: list[int], schedule: Callable[[int], float]) -> StepStats:
    hp, state = run.spec.hyperparameters, run.state
    started = time.perf_counter()
    examples = [run.train_set[index] for index in indices]
    units = token_units(examples)
    learning_rate = hp.learning_rate * schedule(state.step)
    passed = channel.call("forward_backward", {"data": _rows(examples, units)})
    loss = float(passed["loss_sum"])
    if not math.isfinite(loss):
        raise TrainingDiverged(state.step + 1, "the loss is not finite", learning_rate=learning_rate)
    adam = {**ADAM, "learning_rate": learning_rate, "weight_decay": hp.weight_decay,
            "grad_clip_norm": hp.max_grad_norm if hp.max_grad_norm > 0 else 0.0}
    stepped = channel.call("optim_step", {"adam": adam})
    grad_norm = float((stepped.get("metrics") or {}).get("grad_norm:mean", 0.0))
    if not math.isfinite(grad_norm):
        raise TrainingDiverged(state.step + 1, "the gradient norm is not finite", learning_rate=learning_rate)
    tokens = sum(len(example.input_ids) - 1 for example in examples)
    return StepStats(train_loss=loss, train_accuracy=math.nan, grad_norm=grad_norm, learning_rate=learning_rate,
                     num_tokens=units, elapsed_s=time.perf_counter() - started, num_slots=tokens)


def _finish_step(run: Run, channel: PoolChannel, stats: StepStats) -> None:
    """Book the step as the loop does (`loop.finish_step`): history, metrics, validation and
    checkpoint when due (`loop.checkpoint_due`), divergence."""
    state = run.state
    state.step += 1
    state.trained_tokens += stats.num_tokens
    row: dict[str, Any] = {
        "step": state.step, "train_loss": stats.train_loss, "train_accuracy": None,
        "valid_loss": None, "valid_mean_token_accuracy": None,
        "learning_rate": stats.learning_rate, "grad_norm": stats.grad_norm,
        "tokens_per_second": stats.num_tokens / max(stats.elapsed_s, 1e-9),
    }
    diverged = check_divergence(run, stats)
    due = checkpoint_due(run)
    if due and run.valid_set:
        row["valid_loss"] = _valid_loss(run, channel)
    publish_step(run, row)
    log.info("step %d/%d loss %.4f lr %.2e (shared pool)", state.step, run.total_steps, stats.train_loss,
             stats.learning_rate)
    if diverged is not None:
        raise diverged
    if due:
        _save_checkpoint(run, channel)


def _valid_loss(run: Run, channel: PoolChannel) -> float:
    """Mean token loss of the validation set, forward only on the pool."""
    units = token_units(run.valid_set)
    total = 0.0
    for start in range(0, len(run.valid_set), VALID_ROWS):
        rows = _rows(run.valid_set[start:start + VALID_ROWS], units)
        total += float(channel.call("forward_backward", {"data": rows, "forward_only": True})["loss_sum"])
    return total


def _save_checkpoint(run: Run, channel: PoolChannel) -> str:
    ensure_current(run)
    spec, state = run.spec, run.state
    saved = channel.call("save")
    files = {POOL_STATE: base64.b64decode(saved["state"]),
             ckpt.ADAPTER_WEIGHTS: base64.b64decode(saved["peft_weights"]),
             ckpt.ADAPTER_CONFIG: json.dumps(saved["peft_config"]).encode(),
             ckpt.TRAINER_STATE: json.dumps(asdict(state)).encode()}
    prefix = layout.checkpoint_prefix(spec.tenant_id, spec.job_id, state.step)
    ckpt.write_checkpoint(run.store, prefix, files, step=state.step)
    ckpt.prune_checkpoints(run.store, layout.checkpoints_prefix(spec.tenant_id, spec.job_id),
                           spec.checkpoint.keep_last, by_epoch=spec.checkpoint.every_epoch)
    run.last_checkpoint_step, run.last_checkpoint_time = state.step, time.monotonic()
    epoch = state.epoch if state.index_in_epoch == 0 and state.step > 0 else None
    if run.trackers is not None:
        run.trackers.sync()
    run.reporter.report("checkpoints", {"step": state.step, "prefix": prefix, "epoch": epoch,
                                        "metrics": checkpoint_metrics(state.history[-1])})
    return prefix


def _stop_early(run: Run, channel: PoolChannel, reason: str) -> TrainerExit:
    ensure_current(run)
    if run.state.step > 0 and run.last_checkpoint_step != run.state.step:
        _save_checkpoint(run, channel)
    run.reporter.report("events", message_event(
        f"stopped after step {run.state.step} ({reason}); checkpoint kept", level="warn",
        data={"step": run.state.step, "reason": reason}))
    return TrainerExit.PREEMPTED


def _final(run: Run, channel: PoolChannel, base_dir: Path) -> TrainerExit:
    """The last checkpoint on the pool, then the base with the trained adapter, loaded here once,
    for the artifacts and the evaluation as any job has them (`loop.save_final`)."""
    ensure_current(run)
    spec, last = run.spec, run.state.history[-1]
    if run.valid_set and last["valid_loss"] is None:
        record_validation(last, Validation(_valid_loss(run, channel), math.nan, {}))
        last["valid_mean_token_accuracy"] = None  # (not measured on the pool)
    prefix = layout.checkpoint_prefix(spec.tenant_id, spec.job_id, run.state.step)
    if run.last_checkpoint_step != run.state.step:
        prefix = _save_checkpoint(run, channel)
    device = pick_device(spec.gpus)
    model, _tokenizer = load_base_model(base_dir, device)
    model = prepare_trainable(model, spec.training_type, spec.lora, seed=spec.seed)
    loaded = load_adapter_weights(run.store, model, prefix)
    log.info("loaded the adapter trained on the pool (%d tensors) for the artifacts and the eval", loaded)
    run.model, run.device = model, device
    return save_final(run)
