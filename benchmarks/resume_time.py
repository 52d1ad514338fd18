"""Resume time does not grow with the step reached.

    python benchmarks/resume_time.py [--late-step 2000] [--repeats 3]

Trains the demo's tiny model (one example per step, so steps are cheap) to an
early and to a late step, stopping there as on SIGTERM (checkpoint, exit
PREEMPTED); then times a new attempt from its start to the moment it has
restored the checkpoint and is ready to train (the "resumed from the
checkpoint" event), each measured `--repeats` times. A resume that replayed the data loader would grow
linearly with the step; tuneforge computes the epoch's order from
(seed, epoch) and reads one checkpoint. The early step is the baseline the
late one is compared with, in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from tuneforge.demo.dataset import demo_examples
from tuneforge.demo.tiny_model import build_tiny_model
from tuneforge.domain.exit_codes import TrainerExit
from tuneforge.domain.spec import BaseModelRef, CheckpointPolicy, DataFileRef, Hyperparameters, JobSpec, LoraConfig
from tuneforge.storage import layout
from tuneforge.storage.store import open_store
from tuneforge.train.reporter import RecordingReporter
from tuneforge.train.runner import run_attempt


class TimedReporter(RecordingReporter):
    """Notes when the 'resumed' event is reported."""

    def __init__(self, attempt: int) -> None:
        super().__init__(attempt=attempt)
        self.resumed_at: float | None = None

    def report(self, kind, body):  # noqa: ANN001, ANN201
        if kind == "events" and str(body.get("message", "")).startswith("resumed from the checkpoint"):
            self.resumed_at = time.perf_counter()
        return super().report(kind, body)


def _spec(root: Path, model_dir: Path, job_id: str, n_examples: int, epochs: int) -> JobSpec:
    store = open_store(str(root / "objects"))
    prefix = layout.base_model_prefix("tiny", "0" * 64)
    if not store.exists(f"{prefix}/config.json"):
        store.upload_dir(model_dir, prefix)
    key = layout.file_key("bench", "file-train", "train.jsonl")
    examples = demo_examples(n_keys=n_examples)
    store.put_bytes(key, "".join(json.dumps(e) + "\n" for e in examples).encode())
    return JobSpec(
        job_id=job_id, tenant_id="bench", attempt=1, seed=0, base_model=BaseModelRef("tiny", "0" * 64, prefix),
        training_file=DataFileRef("file-train", key), validation_file=None, method="supervised",
        training_type="lora", lora=LoraConfig(rank=8, alpha=16),
        hyperparameters=Hyperparameters(n_epochs=epochs, batch_size=1, micro_batch_size=1, learning_rate=1e-3,
                                        warmup_ratio=0.0, max_seq_length=128),
        checkpoint=CheckpointPolicy(every_steps=10_000, keep_last=2), storage_url=str(root / "objects"),
        callback_url="http://127.0.0.1:9", job_token="t", heartbeat_interval_s=60, cache_dir=str(root / "cache"),
    )


def measure(root: Path, model_dir: Path, step: int, n_examples: int, epochs: int, repeats: int) -> dict:
    spec = _spec(root, model_dir, f"ftjob-step-{step}", n_examples, epochs)
    store = open_store(spec.storage_url)
    started = time.perf_counter()
    first = replace(spec, extra={"stop_after_step": step})
    assert run_attempt(first, store, RecordingReporter()) == TrainerExit.PREEMPTED
    train_s = time.perf_counter() - started
    ready = []
    for attempt in range(2, 2 + repeats):
        # stop right after resuming: the attempt checkpoints again at the same step, nothing is trained
        again = replace(spec, attempt=attempt, extra={"stop_after_step": step})
        reporter = TimedReporter(attempt)
        began = time.perf_counter()
        assert run_attempt(again, store, reporter) == TrainerExit.PREEMPTED
        ready.append(reporter.resumed_at - began)
    return {"step": step, "train_s": train_s, "resume_ready_s": statistics.median(ready), "all": ready}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--early-step", type=int, default=5)
    parser.add_argument("--late-step", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    print(f"machine: {os.cpu_count()} cores, {cpu}; Python {platform.python_version()}")
    n_examples = 24
    epochs = args.late_step // n_examples + 2
    with tempfile.TemporaryDirectory(prefix="tuneforge-resume-") as scratch:
        model_dir = build_tiny_model(Path(scratch) / "model")
        rows = [measure(Path(scratch) / f"s{step}", model_dir, step, n_examples, epochs, args.repeats)
                for step in (args.early_step, args.late_step)]
    print(f"{'step':>8}{'trained in s':>14}{'resume ready s (median)':>26}{'each':>28}")
    for row in rows:
        each = ", ".join(f"{v:.2f}" for v in row["all"])
        print(f"{row['step']:>8}{row['train_s']:>14.1f}{row['resume_ready_s']:>26.2f}{each:>28}")
    early, late = rows
    print(f"resume at step {late['step']} / at step {early['step']}: "
          f"{late['resume_ready_s'] / early['resume_ready_s']:.2f}x for {late['step'] / early['step']:.0f}x the steps")


if __name__ == "__main__":
    main()
