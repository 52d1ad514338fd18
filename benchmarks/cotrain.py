"""Co-training throughput: 8 LoRA fine-tunes of one base model trained together in one batched
pass (`tuneforge.train.cotrain.SharedBase`), against the same 8 fine-tunes trained one at a time
in one process and in 8 separate processes, in one run.

The setup. One random-weight base (`tuneforge.demo.tiny_model.build_tiny_model`, its default
size unless asked otherwise: a 230 k-parameter Llama with a real byte-level BPE tokenizer) and
8 LoRA models on it, as 8 tenants' fine-tunes would be: ranks 8, 8, 16, 16, 16, 32, 32, 32
(alpha 32, on every linear layer and the output head: the engine's default shape), each with
its own data set, the demo task's (`tuneforge.demo.dataset.demo_examples`: 24 chat examples
"What is the code for velmorix?" -> "QT-583", drawn with the model's own seed, so every model
learns other facts), tokenized with the base's tokenizer: the prompt rendered by its chat
template, the answer and its end-of-turn token after it; cross-entropy on the answer's tokens
only (weights 1 there, 0 on the prompt). Every model takes the same number of steps, each step
a batch of 8 of its examples (the demo's batch size; its own shuffled order, epoch after epoch)
and one AdamW step at the same learning rate (3e-3: at the demo's 1e-2 these sums of token
losses make the loss oscillate from step to step, and a float32 rounding difference then
changes where a model ends). A model's seed (its adapter's initialisation, its facts, its order) is
the same in the three ways.

The three ways, each in fresh child processes (so that a way's peak memory is its own):

1. **co-trained**: one process, one `SharedBase` hosting the 8 models; every step is ONE
   `forward_backward` call holding the 8 models' requests (one batched pass through the
   base: 64 rows), then each model's `optim_step`;
2. **one at a time**: one process, one `SharedBase` hosting the 8 models; the models are
   trained one after the other, each step a pass of that model's request alone (8 rows);
3. **separate processes**: 8 child processes started at once, each loading the base itself
   into its own `SharedBase` and training its one model alone (the same engine with one
   hosted model: the same kernels, the same numbers as way 2 up to thread count).

Each child loads the base, builds its data, then warms up: 2 steps of throwaway adapters of
the same ranks on the same batches, trained the way's own way, then dropped (the trained models
never see them). It then says it is ready and waits; once every child of the way is ready the
parent releases them all at once and the clock starts. What is measured, per way:

- **wall**: from the release to the end of the last model's last optimizer step (the
  children's `time.monotonic()`, one clock for the whole machine);
- **aggregate trained tokens/s**: the tokens of every model's batches over every step (the
  real tokens of the rows, never padding) / wall;
- **padding**: padded positions / positions computed (a co-trained pass pads its 64 rows to
  its longest row, a model alone its 8 rows to theirs);
- **peak memory**: `ru_maxrss` of the child (`os.wait4`); for the separate processes the sum
  over the 8 children, with the number of copies of the base that were in memory;
- **process wall**: from starting the children to the last one's exit (imports, base load,
  data, warm-up, training and the final loss included): what a fresh start costs;
- **each model's final loss**: after the last step, each model alone (`forward_only`) over
  its whole data set: the mean cross-entropy per answer token.

Then the check: each model's final loss co-trained against its loss one at a time and in its
own process. Same seed, same data, same order, same steps: only the order of the floating-point
additions inside the batched matrix products differs (float32), which Adam carries from step to
step; the largest relative difference must stay within LOSS_RTOL or the script exits 1. And the
speed-ups, co-trained against separate processes and against one at a time, against the goal
(co-training >= 2x separate processes' and >= 1.5x one at a time's aggregate tokens/s, one copy
of the base in memory).

A busy machine: before each way the parent waits (up to --wait-quiet seconds) for the other
processes to go quiet, and runs a way again (up to --retries times) when other processes used
more than a quarter of a core during it or it did not end within --timeout; the least disturbed
attempt is reported. With 2 threads a process whose second core is taken by other work slows
down many times over (each operator waits for its other thread), so contended figures mean little.

Threads: the in-process ways run `torch.set_num_threads(--threads)` (2: the machine's cores);
each of the 8 separate processes `torch.set_num_threads(--child-threads)` (1: 8 threads on the
cores together; 2 each would be 16). OMP_NUM_THREADS and MKL_NUM_THREADS are set to the same
number in each child.

    python benchmarks/cotrain.py                  # 8 models x 60 steps, ~2 min on 2 quiet CPU cores
    python benchmarks/cotrain.py --seed 1         # other adapters, facts and orders
    python benchmarks/cotrain.py --threads 1      # 1 torch thread in every process
    python benchmarks/cotrain.py --batch-size 1   # each model one example a step
    python benchmarks/cotrain.py --profile 5      # where a co-trained and a one-at-a-time step's time goes
    python benchmarks/cotrain.py --device cuda --hidden-size 2048 --intermediate-size 5632 --layers 8 \
        --heads 16 --kv-heads 4 --wait-quiet 0   # on one GPU, a base one pass of 8 rows does not fill

`--profile N` runs none of the three ways: it trains throwaway adapters N steps each way in
this process, under pass-through timers (the base's forward, the adapters' LoRA branches, the
loss, the backward pass, the optimizer) and then under `torch.profiler`, and prints both.
docs/benchmarks-cotrain.md has the figures and their reading. Everything stays on local disk.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_SRC = BENCH_DIR.parent / "src"
# benchmarks/ is not a package; and this checkout's tuneforge is measured, wherever an editable
# install on this machine points (the children inherit it through PYTHONPATH)
sys.path[:0] = [str(REPO_SRC), str(BENCH_DIR)]

WAYS = ("cotrained", "sequential", "separate")
WAY_TITLES = {"cotrained": "co-trained", "sequential": "one at a time", "separate": "separate processes"}
RANKS = (8, 8, 16, 16, 16, 32, 32, 32)  # the ranks of 8 models; other counts spread them the same way
GOAL_VS_SEPARATE = 2.0  # co-trained aggregate tokens/s over 8 separate processes'
GOAL_VS_SEQUENTIAL = 1.5  # co-trained aggregate tokens/s over one at a time's
# Relative difference allowed between a model's final loss co-trained and alone. The gradients of
# one step agree to ~1e-6 (tests/unit/train/test_cotrain.py); Adam carries the difference through
# every step. At the default learning rate the final losses of 1 and 2 torch threads differ by up
# to ~2e-6 after 60 steps; at 1e-2 the training oscillates and such differences grew to tens of
# percent in 30 steps.
LOSS_RTOL = 1e-4
# On a GPU the engine runs the base in bfloat16 (8 bits of mantissa): the order of the additions in a
# 64-row pass and in an 8-row pass then differs by ~1e-3 per step, which Adam carries on.
LOSS_RTOL_BF16 = 5e-2


def loss_rtol(cfg: Any) -> float:
    return LOSS_RTOL if cfg.device == "cpu" else LOSS_RTOL_BF16
WARMUP_STEPS = 2
CONTENDED_CORES = 0.25  # other processes using more than this while a way ran: it is run again (--retries)
POLL_S = 0.02


# -- configuration shared by the parent and the children -----------------------------------------


@dataclass
class Config:
    models: int = 8
    steps: int = 60
    seed: int = 0
    batch_size: int = 8  # examples per model per step
    examples: int = 24  # examples in each model's data set
    learning_rate: float = 3e-3
    threads: int = 2  # torch threads of the co-trained and the one-at-a-time process
    child_threads: int = 1  # torch threads of each separate process
    model_seed: int = 0
    vocab_size: int = 1024
    hidden_size: int = 64
    intermediate_size: int = 192
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    timeout_s: float = 300.0  # per attempt of a way
    wait_quiet_s: float = 60.0
    retries: int = 2  # a way run while other processes used more than CONTENDED_CORES is run again
    workdir: str = ""
    device: str = "cpu"  # cpu, or cuda: every way's processes on the GPU (bfloat16 there, as the engine runs)


def paths(cfg: Config) -> dict[str, Path]:
    root = Path(cfg.workdir)
    return {"root": root, "model": root / "model", "data": root / "data.json"}


def model_name(index: int) -> str:
    return f"tenant-{index}:sft"


def model_rank(index: int, models: int) -> int:
    return RANKS[index * len(RANKS) // models] if models <= len(RANKS) else RANKS[index % len(RANKS)]


def model_seed(cfg: Config, index: int) -> int:
    """The seed of one model: its adapter's initialisation, its facts and its order, in every way."""
    return cfg.seed * 1000 + index + 1


# -- data (built once by the parent, read by every child) ----------------------------------------


def encode_example(tokenizer: Any, example: dict[str, Any]) -> tuple[list[int], list[float]]:
    """A chat example as (input tokens, per-target weights): the prompt rendered by the chat template
    up to the assistant's turn, then the answer and its end-of-turn token; the targets are the
    inputs shifted by one and only the answer's targets carry weight."""
    prompt = tokenizer.apply_chat_template(example["messages"][:-1], tokenize=False, add_generation_prompt=True)
    answer = example["messages"][-1]["content"] + tokenizer.eos_token + "\n"
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    answer_ids = tokenizer(answer, add_special_tokens=False)["input_ids"]
    ids = prompt_ids + answer_ids
    weights = [0.0] * (len(prompt_ids) - 1) + [1.0] * len(answer_ids)  # weights[j] is for target ids[j + 1]
    return ids, weights


def step_batches(rng: random.Random, examples: int, batch_size: int, steps: int) -> list[list[int]]:
    """`steps` batches of example indices: shuffled epochs, one after the other."""
    stream: list[int] = []
    while len(stream) < steps * batch_size:
        order = list(range(examples))
        rng.shuffle(order)
        stream += order
    return [stream[step * batch_size:(step + 1) * batch_size] for step in range(steps)]


def build_data(cfg: Config, tokenizer: Any) -> dict[str, Any]:
    from tuneforge.demo.dataset import demo_examples

    models = []
    for index in range(cfg.models):
        seed = model_seed(cfg, index)
        encoded = [encode_example(tokenizer, example) for example in demo_examples(cfg.examples, seed)]
        models.append({
            "name": model_name(index), "rank": model_rank(index, cfg.models), "seed": seed,
            "examples": [{"ids": ids, "weights": weights} for ids, weights in encoded],
            "batches": step_batches(random.Random(seed), cfg.examples, cfg.batch_size, cfg.steps),
            "first_example": demo_examples(cfg.examples, seed)[0],
        })
    return {"models": models}


# -- the child: one way, one or all of the models ------------------------------------------------


class Engine:
    """The base in a SharedBase and the models of this child, with their data as engine requests."""

    def __init__(self, cfg: Config, data: dict[str, Any], indices: list[int]) -> None:
        import torch

        from tuneforge.modeling.base import load_base_model
        from tuneforge.train.cotrain import AdamParams, Datum, LoraShape, SharedBase

        model, tokenizer = load_base_model(paths(cfg)["model"], torch.device(cfg.device))
        self.base = SharedBase(model, tokenizer)
        self.adam = AdamParams(learning_rate=cfg.learning_rate)
        self.models = [data["models"][index] for index in indices]
        self.data: dict[str, list[Any]] = {}
        for spec in self.models:
            self.data[spec["name"]] = [
                Datum(example["ids"][:-1], {"target_tokens": torch.tensor(example["ids"][1:], dtype=torch.long),
                                            "weights": torch.tensor(example["weights"], dtype=torch.float32)})
                for example in spec["examples"]]
        self.shape = LoraShape
        self.base_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        self.tokens = 0
        self.positions = 0
        self.passes = 0

    def host(self, name: str, rank: int, seed: int) -> None:
        self.base.host(name, self.shape(rank=rank, seed=seed))

    def requests(self, names: list[str], step: int, batch_of: Callable[[str, int], list[int]],
                 data_of: Callable[[str], str]) -> list:
        """Each model's request of one step: its batch of that step, from the data of `data_of(name)`."""
        from tuneforge.train.cotrain import ForwardBackward

        return [ForwardBackward(name, [self.data[data_of(name)][i] for i in batch_of(name, step)]) for name in names]

    def train_pass(self, requests: list) -> dict[str, float]:
        """One forward_backward call (one batched pass) and each of its models' optimizer step;
        returns each model's mean loss per weighted token."""
        from tuneforge.train.cotrain import RequestError

        rows = [datum for request in requests for datum in request.data]
        self.tokens += sum(len(datum.tokens) for datum in rows)
        self.positions += len(rows) * max(len(datum.tokens) for datum in rows)
        self.passes += 1
        results = self.base.forward_backward(requests)
        losses = {}
        for request, result in zip(requests, results):
            if isinstance(result, RequestError):
                raise RuntimeError(f"{request.model}: {result.message}")
            weight = sum(float(datum.inputs["weights"].sum()) for datum in request.data)
            losses[request.model] = result.metrics["loss:sum"] / weight
        for request in requests:
            self.base.optim_step(request.model, self.adam)
        return losses

    def final_loss(self, name: str) -> float:
        """The model alone, forward only, over its whole data set: mean cross-entropy per answer token."""
        from tuneforge.train.cotrain import ForwardBackward

        data = self.data[name]
        (result,) = self.base.forward_backward([ForwardBackward(name, data, forward_only=True)])
        return result.metrics["loss:sum"] / sum(float(datum.inputs["weights"].sum()) for datum in data)


def run_steps(engine: Engine, way: str, names: list[str], steps: int, batch_of: Callable[[str, int], list[int]],
              data_of: Callable[[str], str], curves: dict[str, list[float]] | None = None) -> None:
    """`steps` steps of the models `names`, the way's own way: co-trained, every step one pass of
    all of them; else each model its steps one after the other, one pass each."""
    def record(losses: dict[str, float]) -> None:
        if curves is not None:
            for name, loss in losses.items():
                curves.setdefault(name, []).append(loss)

    if way == "cotrained":
        for step in range(steps):
            record(engine.train_pass(engine.requests(names, step, batch_of, data_of)))
        return
    for name in names:
        for step in range(steps):
            record(engine.train_pass(engine.requests([name], step, batch_of, data_of)))


def child_main(way: str, cfg: Config, only: int | None) -> None:
    import torch

    torch.set_num_threads(cfg.child_threads if way == "separate" else cfg.threads)
    side_dir = Path(cfg.workdir) / (way if only is None else f"{way}-{only}")
    data = json.loads(paths(cfg)["data"].read_text())
    indices = list(range(cfg.models)) if only is None else [only]
    engine = Engine(cfg, data, indices)
    specs = engine.models
    by_name = {spec["name"]: spec for spec in specs}

    # warm-up: throwaway adapters of the same ranks on the same first batches, dropped after
    warm = {f"warmup-{spec['name']}": spec["name"] for spec in specs}
    for warm_name, name in warm.items():
        engine.host(warm_name, by_name[name]["rank"], seed=10**6 + by_name[name]["seed"])
    run_steps(engine, way, list(warm), WARMUP_STEPS, lambda warm_name, step: by_name[warm[warm_name]]["batches"][0],
              lambda warm_name: warm[warm_name])
    for warm_name in warm:
        engine.base.drop(warm_name)
    engine.tokens = engine.positions = engine.passes = 0

    for spec in specs:
        engine.host(spec["name"], spec["rank"], spec["seed"])
    names = [spec["name"] for spec in specs]
    (side_dir / "ready").write_text("ready")
    if sys.stdin.readline().strip() != "go":
        raise SystemExit("the parent did not say go")
    cpu_at_go = time.process_time()
    started = time.monotonic()
    curves: dict[str, list[float]] = {}
    run_steps(engine, way, names, cfg.steps, lambda name, step: by_name[name]["batches"][step],
              lambda name: name, curves)
    if cfg.device.startswith("cuda"):
        torch.cuda.synchronize()  # (every step already waited for its losses; nothing left queued)
    ended = time.monotonic()
    cpu_timed = time.process_time() - cpu_at_go
    final = {name: engine.final_loss(name) for name in names}
    result = {"way": way, "only": only, "started": started, "ended": ended, "cpu_at_go": cpu_at_go,
              "cpu_timed_s": cpu_timed, "tokens": engine.tokens, "positions": engine.positions,
              "passes": engine.passes, "threads": torch.get_num_threads(), "base_bytes": engine.base_bytes,
              "final_loss": final, "curves": curves,
              "gpu_peak_mib": torch.cuda.max_memory_allocated() / 2**20 if cfg.device.startswith("cuda") else 0.0}
    (side_dir / "result.json").write_text(json.dumps(result))


# -- the parent: running a way's children ----------------------------------------------------------


class Child:
    """A child process of one way, reaped with `os.wait4` for its peak RSS."""

    def __init__(self, argv: list[str], env: dict[str, str], side_dir: Path) -> None:
        side_dir.mkdir(parents=True, exist_ok=True)
        for stale in ("ready", "result.json"):  # an earlier attempt's
            (side_dir / stale).unlink(missing_ok=True)
        self.side_dir = side_dir
        self.log_path = side_dir / "child.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT)
        self.exit_code: int | None = None
        self.usage: Any = None
        self.exited_at: float | None = None

    def poll(self) -> bool:
        """True once the child has exited (reaped here, its usage kept)."""
        if self.exit_code is None:
            pid, status, usage = os.wait4(self.proc.pid, os.WNOHANG)
            if pid == 0:
                return False
            self.exit_code, self.usage = os.waitstatus_to_exitcode(status), usage
            self.exited_at = time.monotonic()
            self.proc.returncode = self.exit_code  # reaped here: Popen must not wait for it again
        return True

    def ready(self) -> bool:
        return (self.side_dir / "ready").exists()

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"go\n")
        self.proc.stdin.flush()
        self.proc.stdin.close()

    def kill(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        if self.exit_code is None:
            try:
                os.kill(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            _, status, usage = os.wait4(self.proc.pid, 0)
            self.exit_code, self.usage = os.waitstatus_to_exitcode(status), usage
            self.proc.returncode = self.exit_code

    def log_tail(self) -> str:
        try:
            return self.log_path.read_bytes()[-3000:].decode("utf-8", "replace")
        except OSError:
            return ""


class WayTimeout(RuntimeError):
    """A way's children did not finish in time (its children are killed)."""


def run_way(cfg: Config, way: str) -> dict[str, Any]:
    """Start the way's children, release them together once all are ready, wait for them all;
    every child is killed on a failure, a timeout or Ctrl-C."""
    from harness import isolated_child_env, read_machine_cpu_s

    groups: list[int | None] = list(range(cfg.models)) if way == "separate" else [None]
    threads = cfg.child_threads if way == "separate" else cfg.threads
    config_path = Path(cfg.workdir) / "config.json"
    children: list[Child] = []
    deadline = time.monotonic() + cfg.timeout_s

    def check(what: str) -> None:
        for child in children:
            if child.poll() and child.exit_code != 0:
                raise RuntimeError(f"{way} child {child.side_dir.name} exited {child.exit_code} {what}:\n"
                                   f"{child.log_tail()}")
        if time.monotonic() > deadline:
            raise WayTimeout(f"{way}: not done within {cfg.timeout_s:.0f} s ({what})")

    spawned = time.monotonic()
    try:
        for only in groups:
            side_dir = Path(cfg.workdir) / (way if only is None else f"{way}-{only}")
            argv = [sys.executable, __file__, "--child", way, "--config", str(config_path)]
            argv += [] if only is None else ["--only", str(only)]
            env = isolated_child_env(side_dir, threads, cpu_only=cfg.device == "cpu",
                                     extra={"PYTHONPATH": str(REPO_SRC)})
            children.append(Child(argv, env, side_dir))
        while not all(child.ready() for child in children):
            check("before it was ready")
            time.sleep(POLL_S)
        ready_s = time.monotonic() - spawned
        busy_at_go = read_machine_cpu_s()[0]
        go = time.monotonic()
        for child in children:
            child.go()
        while not all(child.poll() for child in children):
            check("while training")
            time.sleep(POLL_S)
        check("at its end")
        busy_after = read_machine_cpu_s()[0]
        exited = max(child.exited_at or 0.0 for child in children)
    except BaseException:
        for child in children:
            child.kill()
        raise
    results = [json.loads((child.side_dir / "result.json").read_text()) for child in children]
    children_cpu_after_go = sum(c.usage.ru_utime + c.usage.ru_stime for c in children) - sum(
        r["cpu_at_go"] for r in results)
    return {
        "way": way, "processes": len(children), "threads": results[0]["threads"],
        "wall_s": max(r["ended"] for r in results) - go,
        "child_spans_s": [r["ended"] - r["started"] for r in results],
        "process_wall_s": exited - spawned, "ready_s": ready_s,
        "tokens": sum(r["tokens"] for r in results), "positions": sum(r["positions"] for r in results),
        "passes": sum(r["passes"] for r in results), "cpu_timed_s": sum(r["cpu_timed_s"] for r in results),
        "peak_rss_mib": [c.usage.ru_maxrss / 1024 for c in children],
        "gpu_peak_mib": [r.get("gpu_peak_mib", 0.0) for r in results],
        "others_cores": max(0.0, busy_after - busy_at_go - children_cpu_after_go) / max(exited - go, 1e-9),
        "base_bytes": results[0]["base_bytes"],
        "final_loss": {name: loss for r in results for name, loss in r["final_loss"].items()},
        "curves": {name: curve for r in results for name, curve in r["curves"].items()},
    }


# -- the parent: the figures -----------------------------------------------------------------------


def summarise(r: dict[str, Any]) -> dict[str, Any]:
    return {**r, "tokens_per_s": r["tokens"] / r["wall_s"], "padding": 1 - r["tokens"] / r["positions"],
            "rss_total_mib": sum(r["peak_rss_mib"]), "base_copies": r["processes"]}


def way_table(s: dict[str, dict[str, Any]]) -> list[str]:
    header = (f"{'way':<20} {'procs':>5} {'thr':>3} {'wall s':>7} {'tok/s':>8} {'CPU s':>7} {'padding':>7} "
              f"{'peak RSS MiB':>12} {'base copies':>11} {'process wall s':>14} {'others':>7} {'try':>3}")
    lines = [header, "-" * len(header)]
    for way, r in s.items():
        lines.append(f"{WAY_TITLES[way]:<20} {r['processes']:>5} {r['threads']:>3} {r['wall_s']:>7.2f} "
                     f"{r['tokens_per_s']:>8.0f} {r['cpu_timed_s']:>7.1f} {r['padding']:>6.1%} "
                     f"{r['rss_total_mib']:>12,.0f} {r['base_copies']:>11} {r['process_wall_s']:>14.1f} "
                     f"{r['others_cores']:>6.2f}c {r.get('attempts', 1):>3}"
                     f"{' CONTENDED' if r['others_cores'] > CONTENDED_CORES else ''}")
    lines.append("  (wall: release to the last model's last step; tok/s: every model's trained tokens / wall; "
                 "CPU s: the children's CPU seconds in that time; peak RSS: of the process, summed over the "
                 "separate ones; process wall: start of the children to the last exit; others: cores the rest "
                 "of the machine used meanwhile; thr: torch threads per process; try: the attempt shown, the "
                 "least contended of those run)")
    sep = s.get("separate")
    if sep:
        spans = sep["child_spans_s"]
        lines.append(f"  separate processes: each child's own training span {min(spans):.2f}-{max(spans):.2f} s; "
                     f"peak RSS per child {min(sep['peak_rss_mib']):,.0f}-{max(sep['peak_rss_mib']):,.0f} MiB; "
                     f"all {len(spans)} ready (imports, base load, warm-up) {sep['ready_s']:.1f} s after the start")
    return lines


def loss_lines(s: dict[str, dict[str, Any]], data: dict[str, Any]) -> tuple[list[str], float]:
    names = [spec["name"] for spec in data["models"]]
    ranks = {spec["name"]: spec["rank"] for spec in data["models"]}
    header = (f"{'model':<14} {'rank':>4} {'first step':>10} {'co-trained':>11} {'one at a time':>13} "
              f"{'separate':>11} {'rel diff co/one':>15} {'rel diff co/sep':>15}")
    lines = [header, "-" * len(header)]
    worst = 0.0
    pair_worst = {"sequential": 0.0, "separate": 0.0}
    for name in names:
        co = s["cotrained"]["final_loss"][name]
        diffs = {}
        for way in ("sequential", "separate"):
            alone = s[way]["final_loss"][name]
            diffs[way] = abs(co - alone) / abs(alone)
            pair_worst[way] = max(pair_worst[way], diffs[way])
        worst = max(worst, *diffs.values())
        lines.append(f"{name:<14} {ranks[name]:>4} {s['cotrained']['curves'][name][0]:>10.4f} {co:>11.6f} "
                     f"{s['sequential']['final_loss'][name]:>13.6f} {s['separate']['final_loss'][name]:>11.6f} "
                     f"{diffs['sequential']:>15.1e} {diffs['separate']:>15.1e}")
    one_sep = max(abs(s["sequential"]["final_loss"][n] - s["separate"]["final_loss"][n])
                  / abs(s["separate"]["final_loss"][n]) for n in names)
    first = max(abs(s["cotrained"]["curves"][n][0] - s["sequential"]["curves"][n][0])
                / abs(s["sequential"]["curves"][n][0]) for n in names)
    lines.append("  (first step: the model's training loss at step 1, co-trained; the others: mean cross-entropy "
                 "per answer token over the model's data set after the last step, the model alone, forward only)")
    lines.append(f"  largest relative difference of the final losses: co-trained vs one at a time "
                 f"{pair_worst['sequential']:.2e}, co-trained vs separate {pair_worst['separate']:.2e}, "
                 f"one at a time vs separate {one_sep:.2e}; of the step-1 losses co-trained vs one at a time "
                 f"{first:.2e}")
    return lines, worst


def speed_lines(s: dict[str, dict[str, Any]]) -> tuple[list[str], bool]:
    co = s["cotrained"]["tokens_per_s"]
    vs_sep, vs_seq = co / s["separate"]["tokens_per_s"], co / s["sequential"]["tokens_per_s"]
    memory = s["separate"]["rss_total_mib"] / s["cotrained"]["rss_total_mib"]
    met = vs_sep >= GOAL_VS_SEPARATE and vs_seq >= GOAL_VS_SEQUENTIAL and s["cotrained"]["base_copies"] == 1
    lines = [
        f"speed-up co-trained / separate processes: {vs_sep:.2f}x aggregate tokens/s "
        f"(process wall, start to exit: {s['separate']['process_wall_s'] / s['cotrained']['process_wall_s']:.2f}x)",
        f"speed-up co-trained / one at a time:      {vs_seq:.2f}x aggregate tokens/s",
        f"peak memory: co-trained {s['cotrained']['rss_total_mib']:,.0f} MiB with 1 copy of the base, separate "
        f"processes {s['separate']['rss_total_mib']:,.0f} MiB with {s['separate']['base_copies']} ({memory:.1f}x)",
        f"goal (co-trained >= {GOAL_VS_SEPARATE:g}x separate processes and >= {GOAL_VS_SEQUENTIAL:g}x one at a "
        f"time, aggregate tokens/s, one copy of the base): {'MET' if met else 'NOT MET'} "
        f"({vs_sep:.2f}x, {vs_seq:.2f}x, {s['cotrained']['base_copies']} copy)",
    ]
    return lines, met


def describe(cfg: Config, model: Any, data: dict[str, Any]) -> list[str]:
    from tuneforge.demo.tiny_model import count_parameters

    c = model.config
    lengths = [len(example["ids"]) - 1 for spec in data["models"] for example in spec["examples"]]
    answer = [sum(example["weights"]) for spec in data["models"] for example in spec["examples"]]
    first = data["models"][0]["first_example"]["messages"]
    return [
        f"model:     random-weight Llama, {count_parameters(model):,} parameters (float32, "
        f"{count_parameters(model) * 4 / 2**20:.2f} MiB): vocab {c.vocab_size}, hidden {c.hidden_size}, "
        f"{c.num_hidden_layers} layers, {c.num_attention_heads} heads / {c.num_key_value_heads} KV heads, "
        f"MLP {c.intermediate_size}; seed {cfg.model_seed}",
        f"models:    {cfg.models} LoRA models, ranks {', '.join(str(spec['rank']) for spec in data['models'])}, "
        f"alpha 32, every linear layer and the output head; AdamW lr {cfg.learning_rate:g} (betas 0.9/0.95, "
        f"no weight decay, no clipping); seeds {', '.join(str(spec['seed']) for spec in data['models'])}",
        f"data:      each model {cfg.examples} demo chat examples of its own ({first[1]['content']!r} -> "
        f"{first[2]['content']!r}, ...), {min(lengths)}-{max(lengths)} input tokens (mean "
        f"{statistics.mean(lengths):.1f}), {min(answer):.0f}-{max(answer):.0f} answer tokens with weight 1; "
        f"cross-entropy on the answer",
        f"steps:     {cfg.steps} per model, {cfg.batch_size} examples each (a co-trained pass: "
        f"{cfg.models * cfg.batch_size} rows); warm-up {WARMUP_STEPS} steps of throwaway adapters per way",
        f"threads:   co-trained and one at a time {cfg.threads}; each separate process {cfg.child_threads} "
        f"({cfg.models * cfg.child_threads} in all on {os.cpu_count()} cores)",
    ]


def machine_lines() -> list[str]:
    from harness import _cpu_model, _git_revision, _memory_gib, load_average, torch_machine_line

    return [
        f"date:      {time.strftime('%Y-%m-%d %H:%M:%S %Z')}",
        torch_machine_line(),
        f"cpu:       {_cpu_model()}, {_memory_gib()} RAM",
        f"load avg:  {load_average()} (other work on this machine skews the figures)",
        f"tuneforge: git {_git_revision()}",
    ]


def prepare(cfg: Config) -> tuple[Any, dict[str, Any]]:
    """The base model folder and every model's data, written under the work folder."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tuneforge.demo.tiny_model import build_tiny_model

    p = paths(cfg)
    build_tiny_model(p["model"], seed=cfg.model_seed, vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                     intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.layers,
                     num_attention_heads=cfg.heads, num_key_value_heads=cfg.kv_heads)
    tokenizer = AutoTokenizer.from_pretrained(p["model"])
    data = build_data(cfg, tokenizer)
    p["data"].write_text(json.dumps(data))
    (p["root"] / "config.json").write_text(json.dumps(asdict(cfg)))
    return AutoModelForCausalLM.from_pretrained(p["model"], dtype=torch.float32), data


def parent_main(cfg: Config, keep: bool, json_out: str) -> int:
    from train_throughput import wait_for_quiet

    root = Path(tempfile.mkdtemp(prefix="tuneforge-cotrain-bench-"))
    cfg.workdir = str(root)
    try:
        for line in machine_lines():
            print(line)
        model, data = prepare(cfg)
        for line in describe(cfg, model, data):
            print(line, flush=True)
        del model
        summaries: dict[str, dict[str, Any]] = {}
        for way in WAYS:
            print()
            for attempt in range(1, cfg.retries + 2):
                if cfg.wait_quiet_s > 0:
                    print(f"waiting for the machine to be quiet: {wait_for_quiet(cfg.wait_quiet_s)}", flush=True)
                print(f"running {WAY_TITLES[way]} (attempt {attempt}) ...", flush=True)
                try:
                    r = summarise(run_way(cfg, way))
                except WayTimeout as exc:
                    if attempt > cfg.retries:
                        raise
                    print(f"  {exc}: run again", flush=True)  # on a busy machine, as a contended attempt
                    continue
                r["attempts"] = attempt
                contended = r["others_cores"] > CONTENDED_CORES
                print(f"  {r['wall_s']:.2f} s, {r['tokens_per_s']:.0f} tokens/s; other processes used "
                      f"{r['others_cores']:.2f} cores meanwhile"
                      f"{' - CONTENDED: its times are inflated' if contended else ''}", flush=True)
                if way not in summaries or r["others_cores"] < summaries[way]["others_cores"]:
                    summaries[way] = r  # of the attempts, the one the rest of the machine disturbed least
                if not contended:
                    break
        print()
        for line in way_table(summaries):
            print(line)
        print()
        lines, worst = loss_lines(summaries, data)
        for line in lines:
            print(line)
        rtol = loss_rtol(cfg)
        losses_ok = worst <= rtol
        print(f"losses check (each model's final loss co-trained = alone within a relative {rtol:g}): "
              f"{'PASSED' if losses_ok else 'FAILED'} (largest {worst:.2e})")
        print()
        speed, met = speed_lines(summaries)
        for line in speed:
            print(line)
        if cfg.device != "cpu":
            print("GPU memory at its peak (torch's allocator, MiB): " + ", ".join(
                f"{WAY_TITLES[way]} {sum(r['gpu_peak_mib']):.0f}" for way, r in summaries.items()))
        report = {"config": asdict(cfg), "loss_rtol": rtol, "largest_loss_rel_diff": worst,
                  "losses_ok": losses_ok, "goal_met": met, "ways": summaries}
        if json_out:
            Path(json_out).write_text(json.dumps(report, indent=1))
        if keep:
            print(f"\nkept: {root}")
        return 0 if losses_ok else 1
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)


# -- --profile: where a step's time goes -------------------------------------------------------------


PROFILE_PARTS = ("base forward (LoRA branches included)", "  of which the LoRA branches",
                 "loss (SharedBase._datum_loss)", "backward (Tensor.backward)", "optimizer (Adapter.step)")


class Timers:
    """Pass-through wrappers that add up the seconds spent in the functions they wrap."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = {}
        self.depth: dict[str, int] = {}

    def wrap(self, label: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            outer = self.depth.get(label, 0) == 0  # a nested call is inside the outer one's time
            self.depth[label] = self.depth.get(label, 0) + 1
            began = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.depth[label] -= 1
                if outer:
                    self.totals[label] = self.totals.get(label, 0.0) + time.perf_counter() - began
        return wrapper


def _profile_batch(specs: dict[str, Any], owner: dict[str, str], offset: int, name: str, step: int) -> list[int]:
    return specs[owner[name]]["batches"][offset + step]


def profile_main(cfg: Config, steps: int) -> None:
    """N steps of each in-process way on throwaway adapters: a split by pass-through timers, then
    the operators `torch.profiler` finds most expensive (self CPU time)."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    from train_throughput import wait_for_quiet

    from tuneforge.train import cotrain

    root = Path(tempfile.mkdtemp(prefix="tuneforge-cotrain-profile-"))
    cfg.workdir = str(root)
    try:
        for line in machine_lines():
            print(line)
        torch.set_num_threads(cfg.threads)
        cfg.steps = max(cfg.steps, steps + WARMUP_STEPS)
        model, data = prepare(cfg)
        for line in describe(cfg, model, data):
            print(line)
        del model
        engine = Engine(cfg, data, list(range(cfg.models)))
        specs = {spec["name"]: spec for spec in engine.models}
        timers = Timers()
        net = engine.base.model
        forward, delta, loss, backward, step = PROFILE_PARTS
        net.forward = timers.wrap(forward, net.forward)
        cotrain.Adapter.delta = timers.wrap(delta, cotrain.Adapter.delta)
        for name in ("_dense_delta", "_split_delta"):  # a pass's LoRA branches, where the engine has them
            if name in vars(cotrain.SharedBase):
                original = vars(cotrain.SharedBase)[name]
                wrapped = timers.wrap(delta, original.__func__ if isinstance(original, staticmethod) else original)
                setattr(cotrain.SharedBase, name, staticmethod(wrapped) if isinstance(original, staticmethod)
                        else wrapped)
        cotrain.SharedBase._datum_loss = timers.wrap(loss, cotrain.SharedBase._datum_loss)
        torch.Tensor.backward = timers.wrap(backward, torch.Tensor.backward)
        cotrain.Adapter.step = timers.wrap(step, cotrain.Adapter.step)
        engine.base.forward_backward = timers.wrap("forward_backward", engine.base.forward_backward)
        print(f"\nprofile: {steps} steps of {cfg.models} throwaway models each way, after {WARMUP_STEPS} warm-up "
              f"steps; {cfg.threads} torch threads")
        for way in ("cotrained", "sequential"):
            names = []
            for spec in specs.values():
                names.append(f"{way}-{spec['name']}")
                engine.host(names[-1], spec["rank"], seed=spec["seed"])
            owner = {f"{way}-{name}": name for name in specs}
            warm_batch = functools.partial(_profile_batch, specs, owner, 0)
            batch_of = functools.partial(_profile_batch, specs, owner, WARMUP_STEPS)
            run_steps(engine, way, names, WARMUP_STEPS, warm_batch, owner.__getitem__)
            if cfg.wait_quiet_s > 0:
                print(f"\nwaiting for the machine to be quiet: {wait_for_quiet(cfg.wait_quiet_s)}", flush=True)
            timers.totals.clear()
            began = time.perf_counter()
            run_steps(engine, way, names, steps, batch_of, owner.__getitem__)
            wall = time.perf_counter() - began
            print(f"\n{WAY_TITLES[way]}: {wall / steps:.3f} s per step of the {cfg.models} models (timers on)")
            t = timers.totals
            parts = [(label, t.get(label, 0.0)) for label in PROFILE_PARTS]
            inside = sum(seconds for label, seconds in parts[:4] if not label.startswith("  "))
            parts.insert(4, ("rest of forward_backward (checks, batch, results)",
                             t.get("forward_backward", 0.0) - inside))
            parts.append(("rest (the benchmark's own loop)", wall - t.get("forward_backward", 0.0)
                          - t.get(PROFILE_PARTS[-1], 0.0)))
            for label, seconds in parts:
                print(f"  {label:<52} {seconds / steps * 1000:>8.1f} ms/step {seconds / wall:>6.1%}")
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                run_steps(engine, way, names, steps, batch_of, owner.__getitem__)
            events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
            total = sum(e.self_cpu_time_total for e in events)
            print(f"  torch.profiler, operators by self CPU time ({total / 1e3 / steps:.1f} ms/step in operators):")
            for e in sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:15]:
                print(f"    {e.key[:64]:<64} {e.self_cpu_time_total / 1e3 / steps:>8.1f} ms/step "
                      f"{e.self_cpu_time_total / total:>6.1%} {e.count // steps:>6} calls/step")
            for name in names:
                engine.base.drop(name)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _terminated(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    d = Config()
    parser.add_argument("--models", type=int, default=d.models, help="LoRA models trained (ranks spread over 8..32)")
    parser.add_argument("--steps", type=int, default=d.steps, help="optimizer steps per model")
    parser.add_argument("--seed", type=int, default=d.seed, help="seeds every model's adapter, data and order")
    parser.add_argument("--batch-size", type=int, default=d.batch_size, help="examples per model per step")
    parser.add_argument("--examples", type=int, default=d.examples, help="examples in each model's data set")
    parser.add_argument("--learning-rate", type=float, default=d.learning_rate)
    parser.add_argument("--threads", type=int, default=d.threads,
                        help="torch threads of the co-trained and the one-at-a-time process")
    parser.add_argument("--child-threads", type=int, default=d.child_threads,
                        help="torch threads of each separate process")
    parser.add_argument("--model-seed", type=int, default=d.model_seed, help="seed of the random base model")
    parser.add_argument("--vocab-size", type=int, default=d.vocab_size)
    parser.add_argument("--hidden-size", type=int, default=d.hidden_size)
    parser.add_argument("--intermediate-size", type=int, default=d.intermediate_size)
    parser.add_argument("--layers", type=int, default=d.layers)
    parser.add_argument("--heads", type=int, default=d.heads)
    parser.add_argument("--kv-heads", type=int, default=d.kv_heads)
    parser.add_argument("--timeout", type=float, default=d.timeout_s, help="seconds allowed to each attempt of a way")
    parser.add_argument("--wait-quiet", type=float, default=d.wait_quiet_s,
                        help="before each way, wait up to this many seconds for other processes to go quiet")
    parser.add_argument("--retries", type=int, default=d.retries,
                        help="run a way again, at most this many times, while other processes used more than "
                             f"{CONTENDED_CORES} cores during it")
    parser.add_argument("--device", default=d.device, choices=("cpu", "cuda"),
                        help="where every way's processes train (cuda: one GPU, shared by the 8 separate processes)")
    parser.add_argument("--json-out", default="", help="also write every figure to this file")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (model, data, logs)")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="profile N steps of the co-trained and the one-at-a-time way instead of the run")
    parser.add_argument("--child", choices=WAYS, help=argparse.SUPPRESS)  # a child process
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--only", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_main(args.child, Config(**json.loads(Path(args.config).read_text())), args.only)
        return
    if args.models < 1 or args.steps < 1 or not 1 <= args.batch_size <= args.examples:
        parser.error("--models and --steps must be at least 1, --batch-size between 1 and --examples")
    cfg = Config(
        models=args.models, steps=args.steps, seed=args.seed, batch_size=args.batch_size, examples=args.examples,
        learning_rate=args.learning_rate, threads=args.threads, child_threads=args.child_threads,
        model_seed=args.model_seed, vocab_size=args.vocab_size, hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size, layers=args.layers, heads=args.heads, kv_heads=args.kv_heads,
        timeout_s=args.timeout, wait_quiet_s=args.wait_quiet, retries=max(0, args.retries), device=args.device,
    )
    if args.device != "cpu":
        import torch

        if not torch.cuda.is_available():
            parser.error(f"--device {args.device}: no CUDA GPU on this machine")
    import warnings

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # no "Loading weights" bars between the figures
    warnings.filterwarnings("ignore", category=FutureWarning)
    # a SIGTERM unwinds like Ctrl-C: the children are killed and the work folder removed
    signal.signal(signal.SIGTERM, _terminated)
    if args.profile:
        profile_main(cfg, args.profile)
        return
    sys.exit(parent_main(cfg, args.keep, args.json_out))


if __name__ == "__main__":
    main()
