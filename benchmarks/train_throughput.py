"""Training throughput: tuneforge's trainer against TRL's `SFTTrainer` with its
defaults, on the same model, the same data and the same machine, in one run.

What is measured, for each side, in a fresh child process of its own (so its
peak memory is its own and no cache is shared):

- **training loop time**: from the first batch being built (tuneforge: the
  first micro-batch of step 1; TRL: the first call of its data collator) to
  the end of the last optimizer step;
- **end-to-end time**: from the child's first line after its imports to the
  adapter on disk (model load, tokenization, LoRA wrap, loop, save);
- **real tokens/s**: tokens of the training examples actually fed to the model
  (padding never counted), divided by the loop time. tuneforge counts them
  itself (`trained_tokens`); for TRL they are the token counts of its prepared
  training set times the epochs, cross-checked against the attention masks of
  the batches its collator produced;
- **padding fraction**: padding positions / positions computed, from the
  shapes of the batches each side really built (a pass-through wrapper around
  tuneforge's `make_batch` and around TRL's data collator count them);
- **peak RSS**: `ru_maxrss` of the child, from `os.wait4`;
- **held-out eval loss**: after both runs, each side's adapter is loaded onto
  the same base model with PEFT and scored by one function of this file: the
  mean next-token cross-entropy over the assistant tokens of held-out
  examples, in float32, one example per forward pass.

The model is a random-weight Llama with a real byte-level BPE tokenizer
(`tuneforge.demo.tiny_model.build_tiny_model`, a larger configuration: about
14.5 M parameters by default), built once. The data is a deterministic chat
set in OpenAI's format whose tokenized lengths are log-uniform between
--min-tokens and --max-tokens (most short, a few long): the skew that makes
padding expensive.

Both sides train a LoRA adapter with the same rank, alpha, dropout and target
modules (every linear layer but the output head), AdamW with the same learning
rate, effective batch, epochs, linear schedule, warmup ratio, weight decay,
gradient clipping, max sequence length and seed, on the same torch thread
count. Everything else on the TRL side is `SFTConfig`'s default (packing off,
gradient checkpointing on, ...), with one exception on a CPU: `bf16` (TRL's
default is True, which `TrainingArguments` refuses without a bf16 GPU unless
`use_cpu=True`, and then trains under bf16 autocast) is set False so both
sides compute in float32 as tuneforge does on a CPU; `--trl-bf16 on` keeps
TRL's default instead. docs/benchmarks-train.md has the reasoning and figures.

    python benchmarks/train_throughput.py                     # ~12 min on 2 CPU cores
    python benchmarks/train_throughput.py --examples 120 --epochs 1   # a quick look

TRL is not a dependency of tuneforge: `pip install --no-deps trl`, then its
missing non-torch dependencies (`pip install datasets pandas`).

Nothing here asserts a time; everything stays on local disk.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))  # benchmarks/ is not a package

SIDES = ("tuneforge", "tuneforge-nopack", "trl", "trl-nogc", "trl-tuned")
GOAL_SPEEDUP = 2.0  # against TRL's defaults
GOAL_SPEEDUP_TUNED = 1.1  # against TRL set up as an experienced user would (`trl-tuned`)
TUNED_ROWS_PER_STEP = 2  # trl-tuned: packed rows of max_seq_length per optimizer step
EVAL_LOSS_TOLERANCE = 0.02  # tuneforge's eval loss may be at most 2 % above TRL's
CHILD_TIMEOUT_S = 3600.0
IGNORE = -100


# -- configuration shared by the parent and the children -----------------------------------------


@dataclass
class Config:
    examples: int = 300
    heldout: int = 60
    epochs: int = 1
    learning_rate: float = 1e-3
    batch_size: int = 8
    max_seq_length: int = 1024
    warmup_ratio: float = 0.03
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    seed: int = 0
    lora_rank: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    min_tokens: int = 20
    max_tokens: int = 1000
    vocab_size: int = 4096
    hidden_size: int = 384
    intermediate_size: int = 1024
    layers: int = 6
    lm_head_std: float = 0.0  # 0: the demo's logit scale (0.5 at hidden 64), 0.5 * sqrt(64 / hidden)
    heads: int = 6
    kv_heads: int = 2
    threads: int = 2
    device: str = "cpu"
    trl_bf16: str = "auto"
    wait_quiet_s: float = 120.0
    workdir: str = ""
    target_modules: list[str] = field(default_factory=list)

    @property
    def micro_batch_size(self) -> int:
        # tuneforge's control plane takes micro-batches of at most 8; TRL's default per-device batch is 8
        return min(self.batch_size, 8)

    @property
    def accumulation(self) -> int:
        if self.batch_size % self.micro_batch_size:
            raise SystemExit("--batch-size must be at most 8 or a multiple of 8")
        return self.batch_size // self.micro_batch_size

    def head_std(self) -> float:
        return self.lm_head_std or 0.5 * math.sqrt(64 / self.hidden_size)

    def trl_uses_bf16(self) -> bool:
        if self.trl_bf16 == "auto":
            return self.device == "cuda"  # TRL's default on a GPU; float32 like tuneforge on a CPU
        return self.trl_bf16 == "on"


def paths(cfg: Config) -> dict[str, Path]:
    root = Path(cfg.workdir)
    return {"root": root, "model": root / "model", "train": root / "data" / "train.jsonl",
            "heldout": root / "data" / "heldout.jsonl"}


# -- data ----------------------------------------------------------------------------------------

_TOPICS = ["the parser", "a cache", "the scheduler", "our database", "the compiler", "a queue", "the server",
           "the tokenizer", "a worker pool", "the config file", "an index", "the test suite", "a checkpoint",
           "the network", "the model", "a backup"]
_STYLES = ["a short story", "a checklist", "plain notes", "a code review", "a status report", "a tutorial"]
_SUBJECTS = ["the model", "a function", "the server", "my team", "the user", "this test", "the compiler",
             "our script", "the parser", "a worker", "the database", "the cache"]
_VERBS = ["reads", "writes", "returns", "checks", "stores", "sends", "loads", "builds", "updates", "prints",
          "parses", "trains", "finds", "keeps", "moves", "opens"]
_OBJECTS = ["the file", "a list of numbers", "the answer", "every line", "the config", "a new record",
            "the result", "two strings", "the code", "a small table", "the key", "each value", "the report",
            "an error message", "the data"]
_ENDINGS = ["before it starts.", "after each step.", "when the job ends.", "in order.", "for every request.",
            "on the first try.", "without any change.", "again.", "at the end of the day.", "as fast as it can.",
            "once per hour.", "by itself."]
_NAMES = ["load_data", "parse_line", "train_step", "save_model", "read_config", "send_report", "count_words",
          "merge_files", "check_token", "build_index", "sort_items", "split_text"]
_ARGS = ["x", "y", "items", "path", "text", "values", "count", "key", "row", "data"]


def _sentence(rng: random.Random, topic: str) -> str:
    subject = topic if rng.random() < 0.3 else rng.choice(_SUBJECTS)
    text = f"{subject} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} {rng.choice(_ENDINGS)}"
    return text[0].upper() + text[1:]


def _code_line(rng: random.Random) -> str:
    name, arg = rng.choice(_NAMES), rng.choice(_ARGS)
    return f"def {name}({arg}):\n    return {arg} + {rng.randint(0, 99)}"


def _grow(rng: random.Random, tokenizer: Any, budget: int, make) -> str:  # noqa: ANN001
    """Lines from `make` until about `budget` tokens (counted line by line)."""
    lines, used = [], 0
    while used < budget:
        line = make()
        lines.append(line)
        used += len(tokenizer(line + "\n", add_special_tokens=False)["input_ids"])
    return "\n".join(lines)


def make_examples(tokenizer: Any, count: int, seed: str, cfg: Config) -> list[dict[str, Any]]:
    """`count` chat examples whose total length is log-uniform in [min_tokens, max_tokens].

    The user asks for text about a topic in a style; the assistant answers in
    lines from a small grammar that names the topic and follows the style, so
    an adapter has something learnable to pick up."""
    rng = random.Random(seed)
    overhead = 12  # BOS, two ChatML turns' markup and role names
    examples = []
    for _ in range(count):
        total = math.exp(rng.uniform(math.log(cfg.min_tokens), math.log(cfg.max_tokens)))
        content = max(4, int(total) - overhead)
        user_budget = max(3, min(120, int(content * rng.uniform(0.1, 0.3))))
        topic, style = rng.choice(_TOPICS), rng.choice(_STYLES)
        question = f"Write {style} about {topic}."
        user = question if user_budget <= 10 else question + "\n" + _grow(
            rng, tokenizer, user_budget - 8, lambda topic=topic: _sentence(rng, topic))
        code_share = 0.5 if style in ("a code review", "a tutorial") else 0.0
        answer = _grow(rng, tokenizer, max(2, content - user_budget), lambda topic=topic, code_share=code_share: (
            _code_line(rng) if rng.random() < code_share else f"- {_sentence(rng, topic)}"))
        examples.append({"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]})
    return examples


def encode_chat(tokenizer: Any, messages: list[dict[str, str]], max_len: int) -> tuple[list[int], int]:
    """Token ids of the whole conversation (the model's own chat template), and
    where the last (assistant) turn starts: the length of the prompt rendered
    with the generation prompt, as the model sees it at inference."""
    prompt_text = tokenizer.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True)
    full_text = tokenizer.apply_chat_template(messages, tokenize=False)
    if not full_text.startswith(prompt_text):
        raise ValueError("the chat template does not render the prompt as a prefix of the conversation")
    ids = tokenizer(full_text, add_special_tokens=False)["input_ids"]  # the template wrote BOS itself
    prompt_ids = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
    start = 0
    while start < min(len(ids), len(prompt_ids)) and ids[start] == prompt_ids[start]:
        start += 1
    return ids[:max_len], min(start, max_len)


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# -- the shared evaluation -------------------------------------------------------------------------


def heldout_loss(model_dir: Path, adapter_dir: Path | None, examples: list[dict[str, Any]], cfg: Config) -> dict:
    """Mean next-token cross-entropy over the assistant tokens of `examples`
    (float32, dropout off, one example per forward pass): the same code for
    every side. `adapter_dir=None` scores the base model."""
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(cfg.threads)
    device = torch.device(cfg.device if cfg.device == "cpu" or torch.cuda.is_available() else "cpu")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device)
    if adapter_dir is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter_dir)
    model.eval()
    loss_sum, counted = 0.0, 0
    with torch.no_grad():
        for example in examples:
            ids, start = encode_chat(tokenizer, example["messages"], cfg.max_seq_length)
            input_ids = torch.tensor([ids], device=device)
            targets = input_ids[0, 1:].clone()
            targets[: max(0, start - 1)] = IGNORE  # logits at i predict token i + 1: the answer from `start` on
            logits = model(input_ids=input_ids).logits[0, :-1].float()
            loss_sum += float(F.cross_entropy(logits, targets, ignore_index=IGNORE, reduction="sum"))
            counted += int((targets != IGNORE).sum())
    return {"loss": loss_sum / max(1, counted), "tokens": counted}


# -- child: tuneforge ------------------------------------------------------------------------------

TENANT, JOB = "bench", "ftjob-throughput"


def stage_tuneforge(cfg: Config, side_dir: Path, packing: bool) -> Path:
    """A local object store holding the base model and the training file, and
    the JobSpec of a supervised LoRA job on them (as tests/helpers/tiny.py
    stages one); returns the spec's path."""
    from tuneforge.domain.spec import BaseModelRef, CheckpointPolicy, DataFileRef, Hyperparameters, JobSpec, LoraConfig
    from tuneforge.storage import layout
    from tuneforge.storage.store import open_store

    p = paths(cfg)
    store_url = str(side_dir / "objects")
    store = open_store(store_url)
    model_prefix = layout.base_model_prefix("bench-llama", "0" * 64)
    store.upload_dir(p["model"], model_prefix)
    train_key = layout.file_key(TENANT, "file-train", "train.jsonl")
    store.put_file(train_key, p["train"])
    hp = Hyperparameters(
        n_epochs=cfg.epochs, batch_size=cfg.batch_size, micro_batch_size=cfg.micro_batch_size,
        gradient_accumulation_steps=cfg.accumulation, learning_rate=cfg.learning_rate,
        warmup_ratio=cfg.warmup_ratio, lr_scheduler_type="linear", weight_decay=cfg.weight_decay,
        max_grad_norm=cfg.max_grad_norm, max_seq_length=cfg.max_seq_length, packing=packing,
    )
    spec = JobSpec(
        job_id=JOB, tenant_id=TENANT, attempt=1, seed=cfg.seed,
        base_model=BaseModelRef("bench-llama", "0" * 64, model_prefix),
        training_file=DataFileRef("file-train", train_key), validation_file=None,
        method="supervised", training_type="lora",
        lora=LoraConfig(rank=cfg.lora_rank, alpha=cfg.lora_alpha, dropout=cfg.lora_dropout,
                        target_modules=list(cfg.target_modules)),
        hyperparameters=hp,
        checkpoint=CheckpointPolicy(every_steps=0, keep_last=1, every_minutes=0.0),  # save only the adapter
        storage_url=store_url, callback_url="http://127.0.0.1:9", job_token="bench",
        gpus=1 if cfg.device == "cuda" else 0, cache_dir=str(side_dir / "cache"),
        cpu_threads=cfg.threads,
    )
    spec_path = side_dir / "spec.json"
    spec.write(spec_path)
    return spec_path


def run_tuneforge_side(cfg: Config, side_dir: Path) -> dict[str, Any]:
    # the libraries the trainer imports lazily are imported before the clock starts, as on the TRL side
    import peft  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401

    from tuneforge.domain.spec import JobSpec
    from tuneforge.storage import layout
    from tuneforge.storage.store import open_store
    from tuneforge.train import objective as token_objective
    from tuneforge.train.reporter import RecordingReporter
    from tuneforge.train.runner import run_attempt

    started = time.perf_counter()
    spec = JobSpec.read(side_dir / "spec.json")
    store = open_store(spec.storage_url)
    seen = {"first": None, "real": 0, "slots": 0, "batches": 0, "shapes": []}
    original_make_batch = token_objective.make_batch

    def observed_make_batch(run, rows):  # noqa: ANN001 - a pass-through that counts what was built
        if seen["first"] is None:
            seen["first"] = time.perf_counter()
        batch = original_make_batch(run, rows)
        seen["real"] += batch.num_tokens
        seen["slots"] += batch.num_slots or batch.input_ids.numel()
        seen["batches"] += 1
        seen["shapes"].append(list(batch.input_ids.shape))
        return batch

    token_objective.make_batch = observed_make_batch
    step_ends: list[float] = []

    class TimedReporter(RecordingReporter):
        def progress(self, step: int, total_steps: int) -> None:
            step_ends.append(time.perf_counter())
            super().progress(step, total_steps)

    reporter = TimedReporter()
    exit_code = run_attempt(spec, store, reporter)
    finished = time.perf_counter()
    if int(exit_code) != 0:
        raise RuntimeError(f"run_attempt exited {exit_code!r}: {reporter.reports[-3:]}")
    adapter_dir = side_dir / "adapter"
    store.download_prefix(layout.artifact_prefix(TENANT, JOB, "adapter"), adapter_dir)
    result = reporter.of_kind("result")[0]
    metrics = [event["data"] for event in reporter.of_kind("events") if event.get("type") == "metrics"]
    started_event = next(body for body in reporter.of_kind("events") if body.get("type") == "message"
                         and "threads" in body.get("data", {}))
    return {
        "loop_s": step_ends[-1] - seen["first"], "end_to_end_s": finished - started, "steps": len(step_ends),
        "real_tokens": int(result["trained_tokens"]), "observed_real_tokens": seen["real"],
        "slots": seen["slots"], "batches": seen["batches"], "threads": started_event["data"]["threads"],
        "first_losses": [m["train_loss"] for m in metrics[:3]], "last_losses": [m["train_loss"] for m in metrics[-3:]],
        "adapter_dir": str(adapter_dir), "max_batch_shape": max(seen["shapes"], key=lambda s: s[0] * s[1]),
    }


# -- child: TRL ------------------------------------------------------------------------------------


def run_trl_side(cfg: Config, side_dir: Path, gradient_checkpointing: bool | None,
                 tuned: bool = False) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import SFTConfig, SFTTrainer

    torch.set_num_threads(cfg.threads)
    started = time.perf_counter()
    p = paths(cfg)
    # The same examples in TRL's conversational prompt-completion form: with its default
    # completion_only_loss=None, TRL then puts the loss on the assistant turn only, as tuneforge does.
    rows = [{"prompt": ex["messages"][:-1], "completion": ex["messages"][-1:]} for ex in read_jsonl(p["train"])]
    dataset = Dataset.from_list(rows)
    overrides: dict[str, Any] = {
        # what must be equal on both sides
        "num_train_epochs": cfg.epochs, "learning_rate": cfg.learning_rate,
        "per_device_train_batch_size": cfg.micro_batch_size, "gradient_accumulation_steps": cfg.accumulation,
        "max_length": cfg.max_seq_length, "seed": cfg.seed,
        "warmup_steps": cfg.warmup_ratio,  # a float below 1 is a ratio: ceil(ratio x total steps), as in tuneforge
        "weight_decay": cfg.weight_decay, "lr_scheduler_type": "linear", "max_grad_norm": cfg.max_grad_norm,
        # no reporting service, no checkpoints: only the final adapter is written
        "report_to": "none", "save_strategy": "no",
    }
    if cfg.device == "cpu":
        if cfg.trl_uses_bf16():
            overrides["use_cpu"] = True  # what TrainingArguments asks for to train bf16 on a CPU
        else:
            overrides["bf16"] = False
    elif not cfg.trl_uses_bf16():
        overrides["bf16"] = False
    if gradient_checkpointing is not None:
        overrides["gradient_checkpointing"] = gradient_checkpointing
    if tuned:
        # TRL as an experienced user sets it up: best-fit-decreasing packing into rows of
        # max_length without padding (position ids mark the examples), no gradient checkpointing,
        # SDPA, and TUNED_ROWS_PER_STEP packed rows per optimizer step (tuneforge packs a step's
        # examples into about that many rows of the same length)
        overrides.update({"packing": True, "packing_strategy": "bfd", "padding_free": True,
                          "gradient_checkpointing": False, "per_device_train_batch_size": TUNED_ROWS_PER_STEP,
                          "gradient_accumulation_steps": 1,
                          "model_init_kwargs": {"attn_implementation": "sdpa"}})
    args = SFTConfig(output_dir=str(side_dir / "out"), **overrides)
    lora = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules=list(cfg.target_modules), task_type="CAUSAL_LM")
    trainer = SFTTrainer(model=str(p["model"]), args=args, train_dataset=dataset, peft_config=lora)

    seen = {"first": None, "real": 0, "slots": 0, "batches": 0, "shapes": []}
    inner = trainer.data_collator

    def observed_collator(features):  # noqa: ANN001 - a pass-through that counts what was built
        if seen["first"] is None:
            seen["first"] = time.perf_counter()
        batch = inner(features)
        seen["real"] += int(batch["attention_mask"].sum()) if "attention_mask" in batch else batch["input_ids"].numel()
        seen["slots"] += batch["input_ids"].numel()
        seen["batches"] += 1
        seen["shapes"].append(list(batch["input_ids"].shape))
        return batch

    trainer.data_collator = observed_collator
    step_ends: list[float] = []

    class StepClock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001
            step_ends.append(time.perf_counter())

    trainer.add_callback(StepClock())
    prepared = trainer.train_dataset
    lengths = [len(ids) for ids in prepared["input_ids"]]
    targets = [sum(label != IGNORE for label in labels[1:]) for labels in prepared["labels"]]
    trainer.train()
    adapter_dir = side_dir / "adapter"
    trainer.save_model(str(adapter_dir))
    finished = time.perf_counter()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return {
        "loop_s": step_ends[-1] - seen["first"], "end_to_end_s": finished - started, "steps": len(step_ends),
        "real_tokens": sum(lengths) * cfg.epochs, "observed_real_tokens": seen["real"],
        "slots": seen["slots"], "batches": seen["batches"], "threads": torch.get_num_threads(),
        "first_losses": losses[:1], "last_losses": losses[-1:], "adapter_dir": str(adapter_dir),
        "max_batch_shape": max(seen["shapes"], key=lambda s: s[0] * s[1]),
        "lengths": lengths, "target_tokens": targets,
        "settings": {"bf16": args.bf16, "use_cpu": args.use_cpu, "gradient_checkpointing": args.gradient_checkpointing,
                     "packing": args.packing, "padding_free": args.padding_free, "optim": str(args.optim),
                     "per_device_train_batch_size": args.per_device_train_batch_size,
                     "gradient_accumulation_steps": args.gradient_accumulation_steps,
                     "completion_only_loss": trainer.completion_only_loss,
                     "assistant_only_loss": args.assistant_only_loss, "loss_type": args.loss_type,
                     "logging_steps": args.logging_steps, "dataloader_num_workers": args.dataloader_num_workers},
    }


def child_main(side: str, cfg: Config) -> None:
    side_dir = paths(cfg)["root"] / side
    if side.startswith("tuneforge"):
        result = run_tuneforge_side(cfg, side_dir)
    else:
        result = run_trl_side(cfg, side_dir, gradient_checkpointing=False if side == "trl-nogc" else None,
                              tuned=side == "trl-tuned")
    status = Path("/proc/self/status").read_text()
    result["vmhwm_kib"] = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")), 0)
    (side_dir / "result.json").write_text(json.dumps(result))


# -- parent ----------------------------------------------------------------------------------------


def child_env(cfg: Config, side_dir: Path) -> dict[str, str]:
    from harness import isolated_child_env

    return isolated_child_env(side_dir, cfg.threads, cpu_only=cfg.device == "cpu")


def run_child(side: str, cfg: Config) -> dict[str, Any]:
    from harness import read_machine_cpu_s, run_measured

    side_dir = paths(cfg)["root"] / side
    side_dir.mkdir(parents=True, exist_ok=True)
    (side_dir / "config.json").write_text(json.dumps(asdict(cfg)))
    if side.startswith("tuneforge"):
        stage_tuneforge(cfg, side_dir, packing=side == "tuneforge")
    busy_before, steal_before = read_machine_cpu_s()
    load_before = os.getloadavg()[0]
    wall, usage = run_measured([sys.executable, __file__, "--side", side, "--config", str(side_dir / "config.json")],
                               child_env(cfg, side_dir), side_dir / "child.log", f"side {side}")
    busy_after, steal_after = read_machine_cpu_s()
    result = json.loads((side_dir / "result.json").read_text())
    child_cpu = usage.ru_utime + usage.ru_stime
    result.update({
        "side": side, "process_s": wall, "peak_rss_mib": usage.ru_maxrss / 1024, "child_cpu_s": child_cpu,
        # CPU time the rest of the machine used while this side ran: other work skews the figures
        "others_cpu_s": max(0.0, (busy_after - busy_before) - child_cpu), "steal_s": steal_after - steal_before,
        "load_before": load_before,
    })
    return result


def _quantiles(values: list[int]) -> str:
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return (f"min {ordered[0]}, p25 {pick(0.25)}, median {pick(0.5)}, p75 {pick(0.75)}, p90 {pick(0.9)}, "
            f"max {ordered[-1]}, mean {statistics.mean(ordered):.0f}")


def _loss_span(r: dict[str, Any]) -> str:
    if not r["first_losses"] or not r["last_losses"]:
        return "(not logged)"
    return f"{r['first_losses'][0]:.3f} -> {r['last_losses'][-1]:.3f}"


def wait_for_quiet(max_wait_s: float, threshold_cores: float = 0.3, window_s: float = 3.0) -> str:
    """Wait (at most `max_wait_s`) until the rest of the machine uses less than
    `threshold_cores` cores over two windows in a row; says what it found."""
    from harness import read_machine_cpu_s

    deadline, waited_from, quiet = time.monotonic() + max_wait_s, time.monotonic(), 0
    level = float("nan")
    while True:
        before = read_machine_cpu_s()[0]
        time.sleep(window_s)
        level = (read_machine_cpu_s()[0] - before) / window_s
        quiet = quiet + 1 if level < threshold_cores else 0
        if quiet >= 2 or time.monotonic() >= deadline:
            break
    state = "quiet" if quiet >= 2 else f"still busy after {max_wait_s:.0f} s"
    return f"{state} ({level:.2f} cores busy, waited {time.monotonic() - waited_from:.0f} s)"


def machine_lines() -> list[str]:
    import platform

    from harness import _cpu_model, _git_revision, _memory_gib, _versions, load_average

    return [
        f"date:      {time.strftime('%Y-%m-%d %H:%M:%S %Z')}",
        f"machine:   {os.cpu_count()} cores, {_cpu_model()}, {_memory_gib()} RAM, "
        f"{platform.system()} {platform.release()}",
        f"load avg:  {load_average()} (other work on this machine skews the figures)",
        f"python:    {platform.python_implementation()} {platform.python_version()}",
        f"packages:  {_versions(('torch', 'transformers', 'peft', 'trl', 'accelerate', 'datasets', 'tokenizers'))}",
        f"tuneforge: git {_git_revision()}",
    ]


def parent_main(cfg: Config, sides: list[str], keep: bool) -> None:
    import warnings

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from tuneforge.demo.tiny_model import build_tiny_model, count_parameters

    hf_logging.disable_progress_bar()  # no "Loading weights" bars between the figures
    warnings.filterwarnings("ignore", category=FutureWarning)
    from tuneforge.train.model import linear_module_names

    for line in machine_lines():
        print(line)
    print(f"threads:   {cfg.threads} torch threads on every side; device {cfg.device}")
    root = Path(tempfile.mkdtemp(prefix="tuneforge-train-bench-"))
    cfg.workdir = str(root)
    p = paths(cfg)
    try:
        # ---------------------------------------------------------------- model, once
        build_tiny_model(p["model"], seed=cfg.seed, vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                         intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.layers,
                         num_attention_heads=cfg.heads, num_key_value_heads=cfg.kv_heads,
                         max_position_embeddings=max(2048, cfg.max_seq_length), lm_head_init_std=cfg.head_std())
        tokenizer = AutoTokenizer.from_pretrained(p["model"])
        model = AutoModelForCausalLM.from_pretrained(p["model"], dtype=torch.float32)
        params = count_parameters(model)
        cfg.target_modules = linear_module_names(model)  # every nn.Linear but the head, for both sides
        c = model.config
        print(f"model:     random-weight Llama, {params:,} parameters ({params / 1e6:.2f} M): vocab {c.vocab_size} "
              f"(asked {cfg.vocab_size}; the builder's BPE trainer stops there), hidden {c.hidden_size}, "
              f"{c.num_hidden_layers} layers, {c.num_attention_heads} heads / {c.num_key_value_heads} KV heads, "
              f"MLP {c.intermediate_size}, untied head drawn with std {cfg.head_std():.3f}")
        del model

        # ---------------------------------------------------------------- data
        train = make_examples(tokenizer, cfg.examples, f"train-{cfg.seed}", cfg)
        heldout = make_examples(tokenizer, cfg.heldout, f"heldout-{cfg.seed}", cfg)
        write_jsonl(p["train"], train)
        write_jsonl(p["heldout"], heldout)
        encoded = [encode_chat(tokenizer, ex["messages"], cfg.max_seq_length) for ex in train]
        lengths = [len(ids) for ids, _ in encoded]
        answer_tokens = [len(ids) - start for ids, start in encoded]
        print(f"data:      {len(train)} training examples, {len(heldout)} held out, OpenAI chat format, "
              f"log-uniform lengths in [{cfg.min_tokens}, {cfg.max_tokens}]")
        print(f"           tokens per training example: {_quantiles(lengths)}")
        print(f"           {sum(lengths):,} tokens per epoch, {sum(answer_tokens):,} of them in assistant turns "
              f"({sum(answer_tokens) / sum(lengths):.0%}); {sum(1 for n in lengths if n >= cfg.max_seq_length)} "
              f"examples cut at {cfg.max_seq_length}")
        print(f"training:  LoRA r={cfg.lora_rank} alpha={cfg.lora_alpha} dropout={cfg.lora_dropout} on "
              f"{', '.join(cfg.target_modules)}; AdamW lr {cfg.learning_rate:g}, weight decay {cfg.weight_decay:g}, "
              f"linear schedule, warmup ratio {cfg.warmup_ratio:g}, max grad norm {cfg.max_grad_norm:g}; "
              f"effective batch {cfg.batch_size} ({cfg.micro_batch_size} x {cfg.accumulation}); {cfg.epochs} epochs; "
              f"max length {cfg.max_seq_length}; seed {cfg.seed}")
        print()

        # ---------------------------------------------------------------- the sides
        results: dict[str, dict[str, Any]] = {}
        for side in sides:
            if cfg.wait_quiet_s > 0:
                print(f"waiting for the machine to be quiet before {side}: {wait_for_quiet(cfg.wait_quiet_s)}",
                      flush=True)
            print(f"running {side} ...", flush=True)
            results[side] = run_child(side, cfg)
            r = results[side]
            others = r["others_cpu_s"] / r["process_s"]
            print(f"  done in {r['process_s']:.1f} s (process), load avg before {r['load_before']:.2f}, "
                  f"other processes used {r['others_cpu_s']:.1f} CPU-s meanwhile ({others:.2f} cores), "
                  f"steal {r['steal_s']:.1f} s{' - CONTENDED: its times are inflated' if others > 0.25 else ''}",
                  flush=True)

        # ---------------------------------------------------------------- checks that both saw the same data
        print()
        expected = sum(lengths) * cfg.epochs
        for side, r in results.items():
            same = "equal" if r["real_tokens"] == expected else f"DIFFERENT (expected {expected:,})"
            seen = "equal" if r["observed_real_tokens"] == r["real_tokens"] else \
                f"DIFFERENT ({r['observed_real_tokens']:,} in the batches)"
            print(f"check {side}: real tokens {r['real_tokens']:,}: {same} to this file's count x epochs; "
                  f"batches built held {seen}")
            if "lengths" in r:
                mismatched = sum(1 for a, b in zip(r["lengths"], lengths) if a != b)
                ours_targets = [len(ids) - start for ids, start in encoded]
                target_diff = sum(1 for a, b in zip(r["target_tokens"], ours_targets) if a != b)
                print(f"check {side}: {mismatched} of {len(lengths)} examples tokenized to a different length, "
                      f"{target_diff} with a different number of loss tokens than this file's encoding")
                print(f"check {side}: TRL settings in effect: {json.dumps(r['settings'], sort_keys=True)}")

        # ---------------------------------------------------------------- the shared evaluation
        print()
        print("held-out eval (mean cross-entropy over assistant tokens, one function for every side) ...", flush=True)
        base_eval = heldout_loss(p["model"], None, heldout, cfg)
        for r in results.values():
            r["eval"] = heldout_loss(p["model"], Path(r["adapter_dir"]), heldout, cfg)
        print(f"  base model without adapter: {base_eval['loss']:.4f} over {base_eval['tokens']:,} tokens")

        # ---------------------------------------------------------------- figures
        print()
        header = (f"{'side':<17} {'loop s':>8} {'e2e s':>8} {'steps':>6} {'real tok':>10} {'real tok/s':>10} "
                  f"{'e2e tok/s':>9} {'padding':>8} {'peak RSS':>10} {'eval loss':>9}  first -> last train loss")
        print(header)
        print("-" * len(header))
        for side, r in results.items():
            r["tokens_per_s"] = r["real_tokens"] / r["loop_s"]
            r["e2e_tokens_per_s"] = r["real_tokens"] / r["end_to_end_s"]
            r["padding_fraction"] = 1 - r["observed_real_tokens"] / r["slots"] if r["slots"] else 0.0
            print(f"{side:<17} {r['loop_s']:>8.1f} {r['end_to_end_s']:>8.1f} {r['steps']:>6} {r['real_tokens']:>10,} "
                  f"{r['tokens_per_s']:>10.0f} {r['e2e_tokens_per_s']:>9.0f} {r['padding_fraction']:>8.1%} "
                  f"{r['peak_rss_mib']:>7.0f} MiB {r['eval']['loss']:>9.4f}  "
                  f"{_loss_span(r)}")
        for side, r in results.items():
            shape = "x".join(map(str, r["max_batch_shape"]))
            flops = 6 * params * r["tokens_per_s"]
            print(f"  {side}: {r['batches']} forward passes, largest batch {shape}, {r['threads']} threads, "
                  f"6*N*tokens/s = {flops / 1e9:.1f} GFLOP/s; child CPU {r['child_cpu_s']:.0f} s, "
                  f"{r['real_tokens'] / r['child_cpu_s']:.0f} real tokens per CPU-second (whole process)")
        if cfg.device == "cuda":
            from tuneforge.train.telemetry import peak_tflops

            peak = peak_tflops(torch.device("cuda"))
            for side, r in results.items():
                mfu = f"{6 * params * r['tokens_per_s'] / (peak * 1e12):.1%}" if peak else \
                    "unknown (set TUNEFORGE_GPU_PEAK_TFLOPS)"
                print(f"  {side}: MFU {mfu} (6 x {params:,} params x real tokens/s over {peak} TFLOP/s peak)")

        # ---------------------------------------------------------------- the goal
        if "tuneforge" in results and "trl" in results:
            tf, trl = results["tuneforge"], results["trl"]
            speedup = tf["tokens_per_s"] / trl["tokens_per_s"]
            e2e_speedup = tf["e2e_tokens_per_s"] / trl["e2e_tokens_per_s"]
            loss_limit = trl["eval"]["loss"] * (1 + EVAL_LOSS_TOLERANCE)
            loss_ok = tf["eval"]["loss"] <= loss_limit
            print()
            print(f"tuneforge / TRL real tokens/s: {speedup:.2f}x in the training loop, {e2e_speedup:.2f}x end to end")
            print(f"eval loss: tuneforge {tf['eval']['loss']:.4f}, TRL {trl['eval']['loss']:.4f} "
                  f"(no worse = at most TRL's x {1 + EVAL_LOSS_TOLERANCE:g} = {loss_limit:.4f}): "
                  f"{'no worse' if loss_ok else 'WORSE'}")
            met = speedup >= GOAL_SPEEDUP and loss_ok
            print(f"goal (>= {GOAL_SPEEDUP:g}x TRL-defaults' real tokens/s in the training loop, eval loss no worse): "
                  f"{'MET' if met else 'NOT MET'}")
        if "tuneforge" in results and "trl-tuned" in results:
            tf, tuned_trl = results["tuneforge"], results["trl-tuned"]
            speedup = tf["tokens_per_s"] / tuned_trl["tokens_per_s"]
            loss_limit = tuned_trl["eval"]["loss"] * (1 + EVAL_LOSS_TOLERANCE)
            loss_ok = tf["eval"]["loss"] <= loss_limit
            print()
            print(f"tuneforge / TRL tuned real tokens/s: {speedup:.2f}x in the training loop, "
                  f"{tf['e2e_tokens_per_s'] / tuned_trl['e2e_tokens_per_s']:.2f}x end to end")
            print(f"eval loss: tuneforge {tf['eval']['loss']:.4f}, TRL tuned {tuned_trl['eval']['loss']:.4f}: "
                  f"{'no worse' if loss_ok else 'WORSE'}")
            met = speedup >= GOAL_SPEEDUP_TUNED and loss_ok
            print(f"goal (>= {GOAL_SPEEDUP_TUNED:g}x TRL-tuned's real tokens/s in the training loop, eval loss "
                  f"no worse): {'MET' if met else 'NOT MET'}")
        (root / "summary.json").write_text(json.dumps({"config": asdict(cfg), "parameters": params,
                                                       "base_eval": base_eval, "results": results}, default=str))
        if keep:
            print(f"\nkept: {root}")
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    d = Config()
    parser.add_argument("--examples", type=int, default=d.examples, help="training examples")
    parser.add_argument("--heldout", type=int, default=d.heldout, help="held-out examples for the eval loss")
    parser.add_argument("--epochs", type=int, default=d.epochs)
    parser.add_argument("--learning-rate", type=float, default=d.learning_rate)
    parser.add_argument("--batch-size", type=int, default=d.batch_size, help="effective batch (examples per step)")
    parser.add_argument("--max-seq-length", type=int, default=d.max_seq_length)
    parser.add_argument("--warmup-ratio", type=float, default=d.warmup_ratio)
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--lora-rank", type=int, default=d.lora_rank)
    parser.add_argument("--lora-alpha", type=int, default=d.lora_alpha)
    parser.add_argument("--lora-dropout", type=float, default=d.lora_dropout)
    parser.add_argument("--min-tokens", type=int, default=d.min_tokens)
    parser.add_argument("--max-tokens", type=int, default=d.max_tokens)
    parser.add_argument("--vocab-size", type=int, default=d.vocab_size)
    parser.add_argument("--hidden-size", type=int, default=d.hidden_size)
    parser.add_argument("--intermediate-size", type=int, default=d.intermediate_size)
    parser.add_argument("--layers", type=int, default=d.layers)
    parser.add_argument("--heads", type=int, default=d.heads)
    parser.add_argument("--kv-heads", type=int, default=d.kv_heads)
    parser.add_argument("--lm-head-std", type=float, default=d.lm_head_std,
                        help="std of the random output head (0: 0.5 * sqrt(64 / hidden), the demo's logit scale)")
    parser.add_argument("--wait-quiet", type=float, default=d.wait_quiet_s,
                        help="before each side, wait up to this many seconds for other processes to go quiet")
    parser.add_argument("--threads", type=int, default=d.threads, help="torch threads on every side (CPU)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=d.device)
    parser.add_argument("--trl-bf16", choices=("auto", "on", "off"), default=d.trl_bf16,
                        help="TRL's bf16: auto = its default (on) on a GPU, off on a CPU (float32 like tuneforge)")
    parser.add_argument("--sides", default="tuneforge,trl",
                        help=f"comma-separated, run in this order, from {', '.join(SIDES)} "
                             "(tuneforge-nopack: packing false; trl-nogc: gradient checkpointing off)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (model, data, adapters)")
    parser.add_argument("--side", help=argparse.SUPPRESS)  # a child process
    parser.add_argument("--config", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        child_main(args.side, Config(**json.loads(Path(args.config).read_text())))
        return
    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    unknown = [s for s in sides if s not in SIDES]
    if unknown:
        parser.error(f"unknown side(s) {unknown}; choose from {SIDES}")
    if any(s.startswith("trl") for s in sides):
        try:
            import trl  # noqa: F401
        except ImportError:
            parser.error("TRL is not installed: pip install --no-deps trl && pip install datasets pandas")
    cfg = Config(
        examples=args.examples, heldout=args.heldout, epochs=args.epochs, learning_rate=args.learning_rate,
        batch_size=args.batch_size, max_seq_length=args.max_seq_length, warmup_ratio=args.warmup_ratio,
        seed=args.seed, lora_rank=args.lora_rank, lora_alpha=args.lora_alpha, lora_dropout=args.lora_dropout,
        min_tokens=args.min_tokens, max_tokens=args.max_tokens, vocab_size=args.vocab_size,
        hidden_size=args.hidden_size, intermediate_size=args.intermediate_size, layers=args.layers,
        heads=args.heads, kv_heads=args.kv_heads, threads=args.threads, device=args.device, trl_bf16=args.trl_bf16,
        lm_head_std=args.lm_head_std, wait_quiet_s=args.wait_quiet,
    )
    _ = cfg.accumulation  # validates the batch split early
    parent_main(cfg, sides, args.keep)


if __name__ == "__main__":
    main()
