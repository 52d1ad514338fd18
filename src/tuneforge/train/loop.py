"""The one training loop: every method, every training type, one attempt, read top to bottom.

    setup       → seeds, device, process group
    load        → base model (and CPU threads for its size), the objective's data,
                  LoRA / full weights, optimizer, LR schedule
    resume      → newest valid checkpoint, or step 0
    steps       → one optimizer step per effective batch; metrics every step;
                  validation + checkpoint every `checkpoint.every_steps`
    checkpoint  → on schedule, on SIGTERM / cancel, before the eval
    eval        → base against fine-tuned (`train/evaluate.py`)
    artifacts   → adapter or model, results.csv, the `result` report

What a method trains on and how a forward pass is scored is its `Objective`
(`train/objective.py`, one module per method in `train/objectives/`); nothing
here depends on which method runs. A step starts with the objective's
rollout phase when it has one (`train/rollout.py`: generate, then score), and
the figures an objective reports of its own travel with the step's row.

Determinism: everything random derives from `spec.seed`. The example order of
an epoch is a pure function of (seed, epoch), so the data position saved in a
checkpoint — (epoch, index in epoch) — resumes without reading the examples
already trained on; RNG, optimizer and scheduler states come back from the
checkpoint. On CPU a resumed run reproduces an uninterrupted one bit for bit.

`hyperparameters.learning_rate` is used as is: the control plane resolved the
multiplier into it. Each optimizer step takes `batch_size` examples in
micro-batches of `micro_batch_size`; the loss is the sum of the objective's
losses over the step divided by its units (`Objective.units`).

Preemption (SIGTERM sets `stop`): the step in progress finishes, a checkpoint
is written, the attempt exits `PREEMPTED` — unless finishing the step would
not leave half of `spec.preempt_grace_s` for the checkpoint: then the step is
abandoned (gradients dropped, data position and RNG states rewound to the
step's start) and the checkpoint holds every completed step. Either way no
completed step is lost, and the resumed run stays bit-identical.

Divergence (`train/guards.py`): a non-finite loss or gradient norm, or a
smoothed loss far above its lowest value for too long, stops the job
(`training_diverged`). No checkpoint is written during such a streak, so the
newest checkpoint is a good one.

Tests reach in only through `run.hooks` (`train/hooks.py`).
`spec.cpu_threads` overrides the size-based choice of CPU threads.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, NamedTuple

import torch

from tuneforge.domain.exit_codes import TrainerExit
from tuneforge.domain.metrics import OBJECTIVE_METRICS_KEY, check_metric_names, checkpoint_metrics, metrics_data
from tuneforge.domain.spec import JobSpec
from tuneforge.storage import layout, model_cache
from tuneforge.storage.store import ObjectStore
from tuneforge.train import attention, distributed, evaluate, fused_loss, rollout, sharded_load, token_shards
from tuneforge.train import checkpoint as ckpt
from tuneforge.train.artifacts import MODEL_CARD, model_card, results_csv, upload_adapter, upload_full_model
from tuneforge.train.batches import epoch_order
from tuneforge.train.errors import AttemptFenced, TrainingDiverged
from tuneforge.train.gpu_telemetry import GpuSampler, SlowdownWatch
from tuneforge.train.guards import check_divergence
from tuneforge.train.hooks import NO_HOOKS, Hooks
from tuneforge.train.model import (
    fetch_base_model,
    flash_attention_available,
    is_adapter,
    load_adapter_weights,
    load_base_model,
    load_spec_base,
    load_tokenizer,
    model_dtype,
    prepare_trainable,
    trainable_parameters,
)
from tuneforge.train.objective import Objective
from tuneforge.train.reporter import Reporter, message_event, metrics_event
from tuneforge.train.run import Run, StepAbandoned, StepMark, StepStats, StepTotals, TrainerState
from tuneforge.train.setup import LR_SCHEDULES, configure_threads, lr_schedule, pick_device, seed_everything
from tuneforge.train.telemetry import step_telemetry
from tuneforge.train.tracking import Trackers

log = logging.getLogger(__name__)


def run_training(spec: JobSpec, store: ObjectStore, reporter: Reporter, stop: threading.Event,
                 objective: Objective, hooks: Hooks = NO_HOOKS) -> TrainerExit:
    """One attempt of `spec` with `objective`; the exit code says how it ended."""
    hp = spec.hyperparameters
    # ------------------------------------------------------------------ setup
    if hp.lr_scheduler_type not in LR_SCHEDULES:
        raise ValueError(f"unknown lr_scheduler_type {hp.lr_scheduler_type!r}")
    seed_everything(spec.seed)
    device = pick_device(spec.gpus, distributed.local_rank_from_env())
    dist = distributed.join(device, spec.distributed_strategy or distributed.default_strategy(spec.training_type),
                            shard_alone=spec.distributed_strategy == "fsdp")
    run = None
    try:
        run = load(spec, store, reporter, stop, objective, device, dist)
        run.hooks = hooks
        run.trackers = Trackers.from_spec(spec, store, reporter) if dist.main else Trackers([], reporter)
        run.trackers.start({"method": spec.method, "training_type": spec.training_type, "seed": spec.seed,
                            **spec.hyperparameters.flat(), **{f"lora_{k}": v for k, v in asdict(spec.lora).items()}})
        if device.type == "cuda":  # NVML's readings of this rank's GPU, where there are any
            run.gpu = GpuSampler.open(device.index or 0)
            run.slowdown = SlowdownWatch() if run.gpu is not None else None
        # ------------------------------------------------------------------ resume
        run.state = resume_or_start(run)
        objective.prepare(run)
        run.dist.reshard(run.model)  # (a method's reference pass leaves a sharded model gathered)
        # ------------------------------------------------------------------ steps
        run.model.train()
        while run.state.step < run.total_steps:
            if reason := stop_reason(run):
                return stop_early(run, reason)  # checkpoint, then exit PREEMPTED
            ensure_current(run)
            mark = StepMark(run.state.epoch, run.state.index_in_epoch, ckpt.capture_rng_state())
            try:
                stats = train_step(run, next_batch(run))
            except StepAbandoned:
                rewind(run, mark)
                return stop_early(run, "preempted")
            finish_step(run, stats)  # metrics; validation + checkpoint when due
        # ------------------------------------------------------------------ eval + artifacts
        return save_final(run)
    finally:
        if run is not None and run.trackers is not None:
            run.trackers.finish({}, succeeded=False)  # a stopped attempt keeps its log
        if run is not None and run.gpu is not None:
            run.gpu.close()
        dist.close()


# -- load ----------------------------------------------------------------------


def _attention_for(device: torch.device) -> str | None:
    """The attention implementation a model built from its config asks for on `device`
    (`load_base_model` tries flash-attention 2 where it can run)."""
    return "flash_attention_2" if flash_attention_available(device, model_dtype(device)) else None


def load(spec: JobSpec, store: ObjectStore, reporter: Reporter, stop: threading.Event, objective: Objective,
         device: torch.device, dist: distributed.Dist) -> Run:
    hp = spec.hyperparameters
    cache_dir = Path(spec.cache_dir) if spec.cache_dir else None
    cached = model_cache.is_cached(spec.base_model, cache_dir)
    base_dir = fetch_base_model(store, spec.base_model, cache_dir)
    # sharded: built on the meta device, each rank then reads only its shard (train/sharded_load.py);
    # where that cannot be done (a checkpoint named otherwise, a continued adapter), loaded whole on the
    # host and moved to the GPU by FSDP a layer at a time
    # (TUNEFORGE_SHARDED_LOAD=0: the whole way on every rank, the baseline of benchmarks/sharded_loading.py)
    by_shard = dist.sharded and spec.training_type != "qlora" and not spec.init_adapter_prefix and \
        os.environ.get("TUNEFORGE_SHARDED_LOAD", "1") != "0"
    skeleton = sharded_load.skeleton(base_dir, model_dtype(device), _attention_for(device)) if by_shard else None
    if skeleton is not None:
        model, tokenizer = skeleton, load_tokenizer(base_dir)
    else:
        model, tokenizer = load_base_model(base_dir, device, quantize_4bit=spec.training_type == "qlora",
                                           place=not dist.sharded)
    threads = configure_threads(device, model.num_parameters(), spec.cpu_threads or None)
    node = os.environ.get("TUNEFORGE_NODE", "")
    reporter.report("events", message_event(
        f"attempt {spec.attempt} started on {device.type}" + (f" on node {node}" if node else ""),
        data={"device": device.type, "threads": threads, "base_model_parameters": model.num_parameters(),
              "node": node, "world_size": dist.world, "strategy": dist.strategy if dist.enabled else "",
              # "downloaded": this node fetched the base model from the object store for this attempt
              "base_model_cache": "hit" if cached else "downloaded"},
    ))
    base_sha = spec.base_model.sha256
    if not dist.main:  # rank 0 tokenizes first and caches; the others then read its cache
        dist.barrier()
    train_set = objective.load(store, spec.training_file, tokenizer, hp, label="training", base_model_sha256=base_sha)
    valid_set = (
        objective.load(store, spec.validation_file, tokenizer, hp, label="validation", base_model_sha256=base_sha)
        if spec.validation_file else []
    )
    if dist.main:
        dist.barrier()
    with sharded_load.adapter_snapshots() if skeleton is not None else contextlib.nullcontext() as snapshots:
        model = prepare_trainable(model, spec.training_type, spec.lora, seed=spec.seed,
                                  gradient_checkpointing=spec.gradient_checkpointing)
    if spec.init_adapter_prefix:  # a continued job: its parent's adapter, not a fresh one (a resume then loads
        loaded = load_adapter_weights(store, model, spec.init_adapter_prefix)  # its own checkpoint over it)
        reporter.report("events", message_event(f"the adapter starts from the parent's ({loaded} tensors)",
                                                data={"tensors": loaded}))
    if hp.packing and not dist.sharded:  # packed rows without an L x L mask where the model allows it
        log.info("packed rows attend with %s", attention.choose(model))  # (train/attention.py)
    if dist.enabled:  # same initial weights everywhere; each rank its own dropout stream
        seed_everything(spec.seed * 1009 + 7919 * dist.rank)
    kept = sharded_load.host_states(model, snapshots) if skeleton is not None else None
    model = dist.wrap(model)  # DDP, or FSDP2 shards (train/distributed.py); as is alone
    if kept is not None:
        read = sharded_load.materialize(model, base_dir, device, model_dtype(device), kept)
        log.info("rank %d read %d bytes of the base model's weights (its shard; built on the meta device)",
                 dist.rank, read)
    if hp.packing and dist.sharded:  # its self-check runs on the device, every rank together
        log.info("packed rows attend with %s", attention.choose(model))
        dist.reshard(model)
    params = trainable_parameters(model)
    optimizer = torch.optim.AdamW(params, lr=hp.learning_rate, weight_decay=hp.weight_decay)
    total_steps = hp.n_epochs * math.ceil(len(train_set) / hp.batch_size)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_schedule(hp, total_steps))
    loss_path = fused_loss.resolve_mode(spec.fused_loss, device)
    log.info("token losses: %s", loss_path if fused_loss.head_of(model, gather=False) else "off (plain)")
    return Run(spec, store, reporter, stop, model, tokenizer, optimizer, scheduler, params,
               train_set, valid_set, device, total_steps, objective=objective, dist=dist, fused_loss=loss_path)


# -- resume --------------------------------------------------------------------


def resume_or_start(run: Run) -> TrainerState:
    root = layout.checkpoints_prefix(run.spec.tenant_id, run.spec.job_id)
    found = ckpt.latest_valid_checkpoint(run.store, root)
    if found is None:
        broken = ckpt.checkpoint_dirs(run.store, root)
        if broken and run.dist.main:
            ckpt.delete_checkpoints_after(run.store, root, -1)
            _report_skipped(run, [step for step, _ in broken], None)
        run.dist.barrier()  # no rank may still be reading what rank 0 deletes
        return TrainerState(num_examples=len(run.train_set))
    saved, rng_restored = ckpt.restore_training_state(found.files, run.model, run.optimizer, run.scheduler,
                                                      run.dist.rank, run.dist.world)
    state = TrainerState(**saved)
    if not rng_restored:  # written by another number of processes: each rank a new dropout stream
        seed_everything(run.spec.seed * 1009 + 7919 * run.dist.rank + 104729 * state.step)
    if state.num_examples != len(run.train_set):
        raise RuntimeError(
            f"checkpoint {found.prefix} was trained on {state.num_examples} examples, "
            f"the training file now has {len(run.train_set)}"
        )
    # Newer folders failed to verify; a fresh checkpoint at their step must not meet their leftovers.
    skipped = [step for step, _ in ckpt.checkpoint_dirs(run.store, root) if step > found.step]
    run.dist.barrier()
    if run.dist.main:
        ckpt.delete_checkpoints_after(run.store, root, found.step)
    if skipped:
        _report_skipped(run, skipped, found.step)
    run.last_checkpoint_step = found.step
    run.reporter.report("events", message_event(
        f"resumed from the checkpoint at step {found.step}",
        data={"step": found.step, "prefix": found.prefix},
    ))
    # Reports of the attempt that wrote this checkpoint may have died with it:
    # the control plane fills in what it is missing from the checkpoint itself.
    run.reporter.report("resumed", {"step": found.step, "prefix": found.prefix, "total_steps": run.total_steps})
    log.info("resumed from %s", found.prefix)
    return state


def _report_skipped(run: Run, steps: list[int], used: int | None) -> None:
    fallback = f"resuming from the checkpoint at step {used}" if used is not None else "starting from step 0"
    run.reporter.report("events", message_event(
        f"checkpoint(s) at step {', '.join(map(str, sorted(steps)))} incomplete or corrupt: {fallback}",
        level="warn", data={"skipped_steps": sorted(steps), "resumed_from_step": used},
    ))


# -- steps ---------------------------------------------------------------------


def ensure_current(run: Run) -> None:
    if run.reporter.fenced:
        raise AttemptFenced(f"attempt {run.spec.attempt} was fenced at step {run.state.step}")
    if run.reporter.refusal is not None:  # a refused report ends the attempt once (train/runner.py)
        raise run.reporter.refusal


def stop_reason(run: Run) -> str | None:
    reason = _local_stop_reason(run)
    if run.dist.enabled and run.dist.any(reason is not None) and reason is None:
        return "preempted"  # another rank was told to stop: the group stops together
    return reason


def _local_stop_reason(run: Run) -> str | None:
    if run.stop.is_set():
        return "preempted"
    if run.reporter.stop_requested:
        return "cancelled"
    return run.hooks.stop_reason(run)


def next_batch(run: Run) -> list[int]:
    """Example indices of the next optimizer step; advances the data position."""
    state, count = run.state, len(run.train_set)
    if run.epoch_cache[0] != state.epoch:
        run.epoch_cache = (state.epoch, epoch_order(count, run.spec.seed, state.epoch))
    order = run.epoch_cache[1]
    indices = order[state.index_in_epoch:state.index_in_epoch + run.spec.hyperparameters.batch_size].tolist()
    state.index_in_epoch += len(indices)
    if state.index_in_epoch >= count:
        state.epoch, state.index_in_epoch = state.epoch + 1, 0
    return indices


def rewind(run: Run, mark: StepMark) -> None:
    """Undo a step that was started but not finished: no trace of it remains."""
    run.optimizer.zero_grad(set_to_none=True)
    run.state.epoch, run.state.index_in_epoch = mark.epoch, mark.index_in_epoch
    ckpt.restore_rng_state(mark.rng)


def step_examples(run: Run, indices: list[int]) -> tuple[list[Any], int, list[Any]]:
    """(some of the step's examples — all of them, or at least its first —, what the whole step's
    loss is averaged over, this rank's share). On token shards or examples tokenized on demand,
    with no rollout, a rank reads only its own share (and the step's first example, a filler for
    a rank with none): the step's units come from the shards' headers, or from every rank's count."""
    shards = run.train_set
    if isinstance(shards, token_shards.TokenShards | token_shards.OnDemand) and \
            getattr(run.objective, "prepare_step", None) is None:
        mine = [shards[index] for index in run.dist.share(indices)]
        if isinstance(shards, token_shards.TokenShards):
            units = shards.units(indices)
        else:  # tokenized only now, each rank its own share: the ranks add up their counts
            units = round(run.dist.sum([float(sum(map(token_shards.example_units, mine)))])[0])
        return mine or [shards[indices[0]]], max(1, units), mine
    step = rollout.prepare(run, [shards[index] for index in indices])  # as is, or the rollouts
    # the units of the whole step, whichever rank scores which example
    return step, max(1, run.objective.units(step)), run.dist.share(step)


def train_step(run: Run, indices: list[int]) -> StepStats:
    hp, dist = run.spec.hyperparameters, run.dist
    started = time.perf_counter()
    step, step_units, mine = step_examples(run, indices)
    chunks = run.objective.chunks(mine, hp)
    # every rank runs as many micro-batches as the busiest (the strategies communicate in the
    # forward and backward passes); a rank short of examples runs fillers that count zero
    rounds = dist.max(len(chunks))
    filler = run.objective.chunks(step[:1], hp)[0] if rounds > len(chunks) else None
    totals = StepTotals()
    for done in range(rounds):
        real = done < len(chunks)
        run.hooks.before_micro_batch(run, done)
        with dist.accumulating(run.model, last=done == rounds - 1):
            scores = run.objective.forward(run, chunks[done] if real else filler)
            if not dist.enabled and not torch.isfinite(scores.loss_sum):
                raise TrainingDiverged(run.state.step + 1, "the loss is not finite",
                                       learning_rate=run.scheduler.get_last_lr()[0])
            weight = dist.loss_scale / step_units if real else 0.0
            (scores.loss_sum * weight).backward()
        totals.add(scores, real=real)
        ensure_current(run)
        run.hooks.after_micro_batch(run, done)
        if run.stop.is_set() and not dist.enabled and done + 1 < len(chunks) and \
                _would_overrun(run, started, done + 1, len(chunks)):
            raise StepAbandoned()  # (a group of ranks always finishes its step together)
    if dist.enabled:
        totals = totals.summed(dist)
        if not math.isfinite(totals.loss_sum):  # every rank sees the same sum: the group stops together
            raise TrainingDiverged(run.state.step + 1, "the loss is not finite",
                                   learning_rate=run.scheduler.get_last_lr()[0])
    max_norm = hp.max_grad_norm if hp.max_grad_norm > 0 else float("inf")
    grad_norm = dist.clip_grad_norm(run.params, max_norm)
    if not math.isfinite(grad_norm):
        raise TrainingDiverged(run.state.step + 1, "the gradient norm is not finite",
                               learning_rate=run.scheduler.get_last_lr()[0])
    learning_rate = run.scheduler.get_last_lr()[0]
    run.optimizer.step()
    run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    return totals.stats(grad_norm=grad_norm, learning_rate=learning_rate, elapsed_s=time.perf_counter() - started)


def telemetry(run: Run, stats: StepStats) -> dict[str, Any]:
    """The step's throughput, padding, memory and MFU, and what the GPU said since the last step
    (train/gpu_telemetry.py); a sustained slow spell reports a warning naming its likely cause."""
    data = step_telemetry(num_tokens=stats.num_tokens, num_slots=stats.num_slots, elapsed_s=stats.elapsed_s,
                          parameters=run.num_parameters, device=run.device, gpus=max(1, run.spec.gpus))
    window = run.gpu.window() if run.gpu is not None else None
    if window is not None:
        data.update(window.row())
    if run.slowdown is not None and (warning := run.slowdown.observe(data["tokens_per_second"], window)):
        run.reporter.report("events", message_event(warning, level="warn", data={"code": "slow_training"}))
    return data


def _would_overrun(run: Run, started: float, done: int, total: int) -> bool:
    """Whether finishing this step would eat into the half of the grace period kept for the checkpoint."""
    now = time.monotonic()
    since_notice = now - getattr(run.stop, "requested_at", now)
    per_micro_batch = (time.perf_counter() - started) / max(1, done)
    return since_notice + per_micro_batch * (total - done) > run.spec.preempt_grace_s / 2


def finish_step(run: Run, stats: StepStats) -> None:
    """Book the step: history, metrics event, and validation + checkpoint when due."""
    state = run.state
    state.step += 1
    state.trained_tokens += stats.num_tokens
    row: dict[str, Any] = {
        "step": state.step, "train_loss": stats.train_loss, "train_accuracy": stats.train_accuracy,
        "valid_loss": None, "valid_mean_token_accuracy": None,
        "learning_rate": stats.learning_rate, "grad_norm": stats.grad_norm,
        **telemetry(run, stats),
    }
    if stats.metrics:  # the objective's own figures, apart from the loop's (`domain/metrics.py`)
        row[OBJECTIVE_METRICS_KEY] = dict(stats.metrics)
    diverged = check_divergence(run, stats)
    due = run.dist.any(checkpoint_due(run))  # clocks differ between ranks: one decides for all
    every = getattr(run.objective, "validate_every", None)  # an objective may validate between checkpoints
    validation_due = due or bool(every and state.step % every(run.total_steps) == 0)
    if validation_due and run.valid_set:
        record_validation(row, validate(run))
    publish_step(run, row)
    log.info("step %d/%d loss %.4f acc %.3f lr %.2e", state.step, run.total_steps,
             stats.train_loss, stats.train_accuracy, stats.learning_rate)
    if diverged is not None:
        raise diverged
    if due:
        save_checkpoint(run)


def checkpoint_due(run: Run) -> bool:
    """Whether the step just booked ends with a checkpoint under the job's policy, in this process's
    view: every_steps, every_minutes, or the end of an epoch retention keeps (the last keep_last:
    an earlier one would be pruned anyway, and preemption is covered by every_steps / every_minutes
    and the SIGTERM save). Never on a state that may be diverging."""
    state, policy = run.state, run.spec.checkpoint
    # the batch of this step was the epoch's last: its position wrapped to the next epoch's start
    epoch_end = state.index_in_epoch == 0 and (
        policy.keep_last <= 0 or state.epoch > run.spec.hyperparameters.n_epochs - policy.keep_last)
    due = (policy.every_steps > 0 and state.step % policy.every_steps == 0) or (
        policy.every_minutes > 0 and time.monotonic() - run.last_checkpoint_time >= policy.every_minutes * 60) or (
        policy.every_epoch and epoch_end)
    return due and state.bad_steps == 0


def publish_step(run: Run, row: dict[str, Any]) -> None:
    """A booked step's row into the history, the trackers, the progress and a metrics event."""
    run.state.history.append(row)
    if run.trackers is not None:
        run.trackers.log(run.state.step, row)
    run.reporter.progress(run.state.step, run.total_steps)
    run.reporter.report("events", metrics_event(metrics_data(row, run.total_steps)))


class Validation(NamedTuple):
    loss: float
    accuracy: float
    metrics: dict[str, float]  # the objective's own figures, averaged over the validation set


@torch.no_grad()
def validate(run: Run) -> Validation:
    """Mean loss, token accuracy and the objective's own figures on the validation set (dropout off)."""
    run.model.eval()
    loss_sum, correct, counted = 0.0, 0, 0
    metrics: dict[str, float] = {}
    try:
        examples = rollout.prepare(run, run.valid_set, validation=True)
        for chunk in run.objective.chunks(examples, run.spec.hyperparameters):
            scores = run.objective.forward(run, chunk)
            loss_sum += float(scores.loss_sum)
            correct, counted = correct + scores.correct, counted + scores.count
            for name, value in scores.metrics.items():
                metrics[name] = metrics.get(name, 0.0) + float(value)
    finally:
        run.model.train()
        run.dist.reshard(run.model)
    counted = max(1, counted)
    return Validation(loss_sum / counted, correct / counted, {name: total / counted for name, total in metrics.items()})


def record_validation(row: dict[str, Any], validation: Validation) -> None:
    """A validation's figures in a step's history row: the loop's, and those of the objective's own
    that it names `valid_*` for the purpose (beside its training figures, which they never replace)."""
    row["valid_loss"], row["valid_mean_token_accuracy"] = validation.loss, validation.accuracy
    own = {name: value for name, value in validation.metrics.items() if name.startswith("valid_")}
    if own:
        check_metric_names(own)
        row[OBJECTIVE_METRICS_KEY] = {**(row.get(OBJECTIVE_METRICS_KEY) or {}), **own}


def save_checkpoint(run: Run) -> str:
    ensure_current(run)  # a fenced attempt must not overwrite the current attempt's checkpoints
    spec, state = run.spec, run.state
    prefix = layout.checkpoint_prefix(spec.tenant_id, spec.job_id, state.step)
    ckpt.save_training_state(run.store, prefix, step=state.step, model=run.model, optimizer=run.optimizer,
                             scheduler=run.scheduler, trainer_state=asdict(state), dist=run.dist)
    if run.dist.main:
        ckpt.prune_checkpoints(run.store, layout.checkpoints_prefix(spec.tenant_id, spec.job_id),
                               spec.checkpoint.keep_last, by_epoch=spec.checkpoint.every_epoch)
    run.dist.barrier()
    run.last_checkpoint_step = state.step
    run.last_checkpoint_time = time.monotonic()
    epoch = state.epoch if state.index_in_epoch == 0 and state.step > 0 else None  # the epoch it ends, 1-based
    if run.trackers is not None:
        run.trackers.sync()  # what was logged so far outlives a preemption
    run.reporter.report("checkpoints", {"step": state.step, "prefix": prefix, "epoch": epoch,
                                        "metrics": checkpoint_metrics(state.history[-1])})
    return prefix


def stop_early(run: Run, reason: str) -> TrainerExit:
    """SIGTERM, cancel or the test hook: keep the work done, then exit `PREEMPTED`."""
    ensure_current(run)
    if run.state.step > 0 and run.last_checkpoint_step != run.state.step:
        save_checkpoint(run)
    run.reporter.report("events", message_event(
        f"stopped after step {run.state.step} ({reason}); checkpoint kept", level="warn",
        data={"step": run.state.step, "reason": reason},
    ))
    return TrainerExit.PREEMPTED


# -- eval + artifacts ----------------------------------------------------------


def save_final(run: Run) -> TrainerExit:
    ensure_current(run)
    spec, state = run.spec, run.state
    last = state.history[-1]
    if run.valid_set and last["valid_loss"] is None:
        record_validation(last, validate(run))
    evaluating = evaluate.eval_config(spec) is not None
    if evaluating and run.last_checkpoint_step != state.step:
        save_checkpoint(run)  # a preemption during the eval then loses no training
    model = whole_model(run)
    if model is None:  # rank 0 writes the artifacts, evaluates and reports
        return TrainerExit.SUCCESS
    run.model = model
    if is_adapter(run.model):
        adapter_prefix = layout.artifact_prefix(spec.tenant_id, spec.job_id, "adapter")
        upload_adapter(run.model, spec.base_model, spec.job_id, run.store, adapter_prefix)
    else:
        adapter_prefix = layout.artifact_prefix(spec.tenant_id, spec.job_id, "model")
        upload_full_model(run.model, run.tokenizer, run.store, adapter_prefix)
    results_key = layout.results_key(spec.tenant_id, spec.job_id)
    run.store.put_bytes(results_key, results_csv(state.history))
    metrics = {**checkpoint_metrics(last), "steps": state.step}
    eval_results = evaluate.evaluate(run, validate) if evaluating else None
    card = model_card(spec, kind="adapter" if is_adapter(run.model) else "model", metrics=metrics,
                      trained_tokens=state.trained_tokens, eval_results=eval_results)
    run.store.put_bytes(f"{adapter_prefix}/{MODEL_CARD}", card.encode())  # before the result registers the files
    if run.trackers is not None:  # before the result: a job that succeeded has its runs complete
        kind = "adapter" if is_adapter(run.model) else "model"  # where the tenant downloads it, not a storage key
        run.trackers.finish({**{k: v for k, v in metrics.items() if v is not None},
                             "artifact": f"/v1/fine_tuning/jobs/{spec.job_id}/download?artifact={kind}",
                             **{f"eval/{side}/{name}": value for side, scores in (eval_results or {}).items()
                                if isinstance(scores, dict) for name, value in scores.items()
                                if isinstance(value, (int, float))}})
    run.reporter.report("result", {
        "trained_tokens": state.trained_tokens, "adapter_prefix": adapter_prefix,
        "results_key": results_key, "metrics": metrics, "eval": eval_results,
        "artifact_kind": "adapter" if is_adapter(run.model) else "model",
    })
    log.info("finished: %d steps, %d trained tokens, adapter at %s", state.step, state.trained_tokens, adapter_prefix)
    return TrainerExit.SUCCESS


def whole_model(run: Run) -> Any:
    """The trained model in one piece on rank 0, for the artifacts and the eval (None on the
    other ranks). Sharded (FSDP): every rank sends its shards, and rank 0 loads the gathered
    weights into the base model loaded afresh — inference needs a fraction of the memory
    training needed (no gradients, no optimizer states)."""
    dist = run.dist
    if not dist.sharded:
        return distributed.unwrap(run.model) if dist.main else None
    spec = run.spec
    adapter = is_adapter(run.model)
    weights = dist.full_state(run.model, trainable_only=adapter)
    if not dist.main:
        return None
    run.model, run.optimizer, run.params = None, None, []  # the shards go before the whole model comes
    if run.device.type == "cuda":
        torch.cuda.empty_cache()
    model, _tokenizer = load_spec_base(run.store, spec, run.device)
    model = prepare_trainable(model, spec.training_type, spec.lora, seed=spec.seed)
    result = model.load_state_dict(weights, strict=False)
    if result.unexpected_keys:
        raise RuntimeError(f"gathered weights do not fit the model: {result.unexpected_keys[:3]}")
    log.info("gathered %d sharded tensors into one model on rank 0", len(weights))
    return model
