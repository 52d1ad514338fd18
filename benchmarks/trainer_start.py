"""Submit-to-trainer-start latency: from `POST /v1/fine_tuning/jobs` to the
job's `running` status (the scheduler admitted it and launched the trainer)
and to the first report of the trainer process itself.

The control plane runs with its scheduler and the local executor
(`TUNEFORGE_LOCAL_GPUS=1`: one slot), on a real tiny Llama
(`tuneforge.demo.tiny_model.build_tiny_model`). Jobs run one after the other:
each is cancelled once its first metrics event arrived (or it ended), and the
next one is submitted only after its trainer process is gone.

Times are observed by this client, polling every POLL_S: the API's event
timestamps are whole seconds. An event counts as the trainer's when it is a
metrics event or its `data` has no `status` key (every event the control plane
writes itself, from job creation to each status change, carries `status`).

A cold-start breakdown follows, measured in fresh processes: interpreter
start, the trainer's heavy imports, and loading the tiny model with a LoRA
wrapper - what a trainer attempt has to do before its first step.
"""

from __future__ import annotations

import json
import math
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from harness import (
    BenchHome,
    PySpy,
    ServerProcess,
    local_client,
    trainer_pids,
    upload_training_file,
)

TINY_MODEL = "bench-tiny"
POLL_S = 0.02
SCHEDULER_TICK_S = 0.5  # the default TUNEFORGE_SCHEDULER_TICK_S, which this benchmark keeps
TRAINER_EXIT_TIMEOUT_S = 30.0
BUILD_TIMEOUT_S = 600.0
COLD_START_REPEATS = 3
TERMINAL = ("succeeded", "failed", "cancelled")
HYPERPARAMETERS = {"n_epochs": 1, "batch_size": 4, "max_seq_length": 128}

_BUILD_TINY = (
    "import sys; from pathlib import Path; from tuneforge.demo.tiny_model import build_tiny_model; "
    "build_tiny_model(Path(sys.argv[1]))"
)
_HAS_TRAINER = (
    "import importlib.util, sys; "
    "sys.exit(0 if importlib.util.find_spec('tuneforge.train.__main__') else 1)"
)
# Timed in a fresh interpreter, in the order a trainer attempt does them
# (tuneforge.train.__main__, then train/loop.py's load phase). transformers
# imports most of its modules lazily, on first use: the tokenizer and model
# steps include those imports, and peft comes after them as in the trainer.
_COLD_START = r"""
import json, sys, time
marks, last = {}, time.perf_counter()
def mark(name):
    global last
    now = time.perf_counter(); marks[name] = now - last; last = now
import torch; mark("import torch")
import transformers; mark("import transformers")
try:
    import tuneforge.train.__main__, tuneforge.train.runner, tuneforge.train.loop
    mark("import tuneforge.train (+ runner, loop)")
except ImportError:
    marks["import tuneforge.train (+ runner, loop)"] = None
from transformers import AutoModelForCausalLM, AutoTokenizer
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1]); mark("load tokenizer (with lazy imports)")
model = AutoModelForCausalLM.from_pretrained(sys.argv[1]); mark("load model (with lazy imports)")
import peft; mark("import peft")
model = peft.get_peft_model(model, peft.LoraConfig(r=8, lora_alpha=16, target_modules="all-linear")); mark("wrap LoRA")
print(json.dumps(marks))
"""


@dataclass
class StartTiming:
    job_id: str
    created_s: float = math.nan
    status_first_seen_s: dict[str, float] = field(default_factory=dict)
    first_trainer_event_s: float = math.nan
    first_metrics_s: float = math.nan
    trainer_events: list[tuple[float, str, str]] = field(default_factory=list)
    outcome: str = ""
    attempts: int = 0

    @property
    def running_s(self) -> float:
        return self.status_first_seen_s.get("running", math.nan)


def is_trainer_event(event: dict) -> bool:
    return event.get("type") == "metrics" or "status" not in (event.get("data") or {})


def trainer_available(home: BenchHome) -> bool:
    done = subprocess.run([sys.executable, "-c", _HAS_TRAINER], env=home.env, capture_output=True, timeout=120)
    return done.returncode == 0


def build_and_register_tiny_model(home: BenchHome) -> Path:
    model_dir = home.root / "models" / TINY_MODEL
    subprocess.run([sys.executable, "-c", _BUILD_TINY, str(model_dir)], env=home.env, check=True,
                   capture_output=True, timeout=BUILD_TIMEOUT_S)
    home.cli("base-models", "add", TINY_MODEL, str(model_dir))
    return model_dir


def _observe(client: httpx.Client, timing: StartTiming, started: float, timeout_s: float,
             on_running: Callable[[], bool] | None = None) -> None:
    """Poll the job (and, once it runs, its events) until the first metrics event, the end, or the deadline.
    `on_running` is called on each poll once the job runs, until it returns True."""
    seen_events: set[str] = set()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = client.get(f"/v1/fine_tuning/jobs/{timing.job_id}").json()
        now = time.perf_counter() - started
        timing.status_first_seen_s.setdefault(job["status"], now)
        timing.attempts = job.get("attempt", 0)
        if "running" in timing.status_first_seen_s:
            if on_running is not None and on_running():
                on_running = None
            events = client.get(f"/v1/fine_tuning/jobs/{timing.job_id}/events", params={"limit": 100}).json()
            now = time.perf_counter() - started
            for event in reversed(events["data"]):  # oldest first
                if event["id"] in seen_events:
                    continue
                seen_events.add(event["id"])
                if is_trainer_event(event):
                    timing.trainer_events.append((now, event["type"], event["message"]))
                    if math.isnan(timing.first_trainer_event_s):
                        timing.first_trainer_event_s = now
                    if event["type"] == "metrics" and math.isnan(timing.first_metrics_s):
                        timing.first_metrics_s = now
        if not math.isnan(timing.first_metrics_s):
            timing.outcome = "first metrics event seen"
            return
        if job["status"] in TERMINAL:
            error = (job.get("error") or {}).get("message", "")
            timing.outcome = f"job {job['status']} before any metrics event: {error[:300]}"
            return
        time.sleep(POLL_S)
    timing.outcome = f"no metrics event within {timeout_s:.0f}s"


def measure_one(client: httpx.Client, home: BenchHome, file_id: str, timeout_s: float,
                profile_path: Path | None = None) -> StartTiming:
    """One job from submit to its first metrics event; with PROFILE_PATH, py-spy samples its trainer."""
    body = {"model": TINY_MODEL, "training_file": file_id,
            "method": {"type": "supervised", "supervised": {"hyperparameters": HYPERPARAMETERS}}}
    # Jobs after the first would otherwise be submitted right after the tick that
    # reaped their predecessor, i.e. always a whole tick before the next one.
    time.sleep(random.uniform(0.0, SCHEDULER_TICK_S))
    started = time.perf_counter()
    response = client.post("/v1/fine_tuning/jobs", json=body)
    response.raise_for_status()
    timing = StartTiming(response.json()["id"], created_s=time.perf_counter() - started)

    with ExitStack() as profiling:
        def attach_profiler() -> bool:
            pids = trainer_pids(home.root, timing.job_id)
            if pids:
                profiling.enter_context(PySpy(pids[0], profile_path, timeout_s, rate_hz=100, gil=False,
                                              settle_s=0.0))
            return bool(pids)

        try:
            _observe(client, timing, started, timeout_s, attach_profiler if profile_path else None)
        finally:
            if client.get(f"/v1/fine_tuning/jobs/{timing.job_id}").json()["status"] not in TERMINAL:
                client.post(f"/v1/fine_tuning/jobs/{timing.job_id}/cancel")
            deadline = time.monotonic() + TRAINER_EXIT_TIMEOUT_S
            while trainer_pids(home.root, timing.job_id) and time.monotonic() < deadline:
                time.sleep(0.1)
    return timing


def cold_start_breakdown(home: BenchHome, model_dir: Path) -> list[dict]:
    runs = []
    for _ in range(COLD_START_REPEATS):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], env=home.env, check=True, timeout=60)
        interpreter_s = time.perf_counter() - started
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", _COLD_START, str(model_dir)], env=home.env, check=True,
                              capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        total_s = time.perf_counter() - started
        marks = json.loads(done.stdout.strip().splitlines()[-1])
        runs.append({"interpreter start (python -c pass)": interpreter_s, **marks, "whole process": total_s})
    return runs


def _fmt(seconds: float | None) -> str:
    return "n/a" if seconds is None or math.isnan(seconds) else f"{seconds * 1000:.0f}"


def print_timings(timings: list[StartTiming]) -> None:
    print("| job | create request ms | queued seen ms | running seen ms | first trainer event ms "
          "| first metrics event ms | attempts | outcome |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for t in timings:
        print(f"| {t.job_id} | {_fmt(t.created_s)} | {_fmt(t.status_first_seen_s.get('queued'))} "
              f"| {_fmt(t.running_s)} | {_fmt(t.first_trainer_event_s)} | {_fmt(t.first_metrics_s)} "
              f"| {t.attempts} | {t.outcome} |")
    spans = {
        "submit -> running (validation + admission + launch call)": [t.running_s for t in timings],
        "running -> first trainer event":
            [t.first_trainer_event_s - t.running_s for t in timings],
        "first trainer event -> first metrics event (step 1 done)":
            [t.first_metrics_s - t.first_trainer_event_s for t in timings],
        "submit -> first metrics event": [t.first_metrics_s for t in timings],
    }
    print("\n| span | median ms | min ms | max ms |")
    print("|---|---:|---:|---:|")
    for name, values in spans.items():
        values = [v for v in values if not math.isnan(v)]
        if values:
            print(f"| {name} | {_fmt(statistics.median(values))} | {_fmt(min(values))} | {_fmt(max(values))} |")
        else:
            print(f"| {name} | n/a | | |")
    for t in timings[:1]:
        if t.trainer_events:
            print(f"\ntrainer events of {t.job_id} as observed (ms after the create request; "
                  f"ms after `running` was seen):")
            for at, kind, message in t.trainer_events[:12]:
                print(f"  {at * 1000:8.0f}  {(at - t.running_s) * 1000:8.0f}  [{kind}] {message[:100]}")


def print_cold_start(runs: list[dict]) -> None:
    names = list(runs[0])
    print(f"| step (fresh process, {len(runs)} runs) | median ms | min ms | max ms |")
    print("|---|---:|---:|---:|")
    for name in names:
        values = [run[name] for run in runs if run.get(name) is not None]
        if not values:
            print(f"| {name} | not importable | | |")
            continue
        print(f"| {name} | {statistics.median(values) * 1000:.0f} | {min(values) * 1000:.0f} "
              f"| {max(values) * 1000:.0f} |")


def trainer_start_phase(home: BenchHome, api_key: str, args, stack: ExitStack) -> list[StartTiming]:
    """The jobs twice: every trainer started cold (TUNEFORGE_TRAINER_WARM_START=false, the
    baseline), then forked from the warm trainer (the default; the first job of that server
    starts cold while the warm process imports)."""
    has_trainer = trainer_available(home)
    print(f"\n== submit-to-trainer-start: {args.trainer_jobs} jobs in a row, scheduler on, one local slot ==")
    if not has_trainer:
        print("  ! `python -m tuneforge.train` is not available in this checkout: no trainer can start, so only "
              "the scheduler's part (submit -> running) is meaningful below", flush=True)
    model_dir = build_and_register_tiny_model(home)
    by_mode: dict[str, list[StartTiming]] = {}
    for mode, warm in (("cold", "false"), ("warm", "true")):
        print(f"\n-- trainers started {mode} (TUNEFORGE_TRAINER_WARM_START={warm}) --")
        server = stack.enter_context(ServerProcess(home, scheduler=True, extra_env={
            "TUNEFORGE_LOCAL_GPUS": "1", "TUNEFORGE_TRAINER_WARM_START": warm}))
        print(f"server:    {server.command_line}  (pid {server.proc.pid})", flush=True)
        timings = []
        with local_client(server.url, headers={"Authorization": f"Bearer {api_key}"}) as client:
            file_id = upload_training_file(client, lines=64)
            for number in range(args.trainer_jobs):
                profile_path = Path(args.py_spy_dir) / f"trainer-start-{mode}.folded" \
                    if args.py_spy_dir and number == 0 else None
                timing = measure_one(client, home, file_id, args.trainer_timeout_s, profile_path)
                print(f"  {timing.job_id}: running after {_fmt(timing.running_s)} ms, first trainer event after "
                      f"{_fmt(timing.first_trainer_event_s)} ms ({timing.outcome})", flush=True)
                timings.append(timing)
        server.stop()
        print()
        print_timings(timings)
        by_mode[mode] = timings
    print(f"\n(polling period {POLL_S * 1000:.0f} ms; scheduler tick {SCHEDULER_TICK_S} s; each job was submitted "
          f"after a random 0-{SCHEDULER_TICK_S} s pause)")
    print("\nsubmit -> first metrics event (step 1 done), every job but each server's first (whose warm "
          "trainer is still importing):")
    print("| trainers | median ms | min ms | max ms |")
    print("|---|---:|---:|---:|")
    for mode, timings in by_mode.items():
        values = [t.first_metrics_s for t in timings[1:]]
        values = [v for v in values if not math.isnan(v)]
        if values:
            print(f"| {mode} | {_fmt(statistics.median(values))} | {_fmt(min(values))} | {_fmt(max(values))} |")
    print("\ncold start of a trainer-like process on the tiny model:")
    print_cold_start(cold_start_breakdown(home, model_dir))
    return [t for timings in by_mode.values() for t in timings]
