"""Reinforcement fine-tuning throughput: tuneforge's GRPO (the `reinforcement` method)
against TRL's `GRPOTrainer`, on the same model, prompts, reward and machine, in one run.

Each side trains a LoRA adapter with GRPO in a fresh child process of its own
(nothing cached is shared), once per seed, and the script prints, per side:

- **s/step**: wall time of one optimizer step (sampling the group, grading it,
  the policy-gradient forward and backward, the optimizer), the mean over every
  step after the first (the first pays one-off warm-up costs);
- **completion tok/s**: completion tokens sampled in those steps (each
  completion's end-of-turn token included, as both sides count it) divided by
  their wall time;
- **the reward curve**: the mean reward of each step's completions (sampled by
  the policy before that step's update), and the mean of the last 5 steps;
- **where a step's time goes**: sampling, grading, the rest of the rollout
  phase (decoding, advantages, batching), the loss forward pass, the backward
  pass and the rest (optimizer, bookkeeping), from timers wrapped around each
  side's own functions (tuneforge: `rollout.prepare`, `sampling.sample`, the
  objective's `_grade` and `forward`; TRL: `_generate_and_score_completions`,
  `_generate_single_turn`, the reward function, `_compute_loss`; both:
  `Tensor.backward`);

then the ratio tuneforge / TRL of steps per second and the difference in
reward, per seed and over the seeds.

The setup. The model is `tuneforge.demo.tiny_model.build_tiny_model`'s random
Llama with a real byte-level BPE tokenizer and a ChatML template, built once
(`--model-seed`) at the size of benchmarks/train_throughput.py's (11.4 M
parameters: vocab 2,514, hidden 384, 6 layers), its output head drawn at
a quarter of the demo's logit scale: at the demo's scale a model this wide is
nearly deterministic, repeats one token, scores ~0.1 and GRPO collapses it to
0. The prompts are 24 chat prompts ending with a user turn ("Say something
about cats"), each with the field `target` = "the the the the the the". The
reward is OpenAI's `text_similarity` grader with `fuzzy_match` on tuneforge's
side (rapidfuzz.fuzz.ratio(completion, target) / 100, run by
`graders/score.py`) and a python reward function computing exactly that on
TRL's side: dense, so the random base already scores about 0.18 and an adapter
can climb from there. 4 prompts x 8 completions of at most 24 tokens per step,
30 steps (5 passes over the prompts), LoRA r 16 / alpha 32, learning rate 1e-2.

What is equal on both sides: the model (float32), the prompts (the check line
says whether both rendered them to the same token ids), the reward, the group
size (`samples_per_prompt` = `num_generations`), the prompts per step
(`batch_size` prompts = `generation_batch_size` / `num_generations`), one
forward/backward pass per step over all the step's completions (tuneforge
`micro_batch_size` = the prompts of a step; TRL `per_device_train_batch_size`
= every completion of the step, `gradient_accumulation_steps` 1), the longest
completion, temperature 1.0 with no top-k/top-p, the number of steps, LoRA
rank / alpha / dropout 0 on every linear layer but the head, AdamW at the same
learning rate with a linear decay and no warmup, no weight decay, gradient
clipping at 1.0, clipping epsilon 0.2, no KL term (tuneforge `kl_coef` 0, TRL
`beta` 0.0: no reference pass on either side), one policy update per batch of
rollouts (TRL's `num_iterations` 1 and `steps_per_generation` left at their
defaults), the seed and the torch thread count.

Token-level loss aggregation: tuneforge's `loss_aggregation: token_mean`
divides the step's summed token losses by the step's completion tokens; TRL's
`loss_type="dapo"` (its default) divides by the completion tokens of the whole
generation batch, which is the step here: the same loss. Advantages on both
sides: each reward minus its group's mean, divided by its group's standard
deviation + 1e-4 (tuneforge `scale_rewards: true`, TRL `scale_rewards="group"`).

Where the two sides differ, and why:

- TRL's standard deviation is Bessel-corrected (divides by G - 1), tuneforge's
  is not (divides by G): TRL's advantages are sqrt((G - 1) / G) of
  tuneforge's (6.5% smaller at G = 8). Neither can be set to the other's;
  AdamW makes the update almost insensitive to a constant factor.
- TRL runs on the CPU as its docs say to (`use_cpu=True`) but with `bf16=False`
  (its default True would train under bf16 autocast): both compute in float32.
- `gradient_checkpointing=False` on TRL (GRPOConfig's default is True, a
  memory saving that recomputes every layer's activations in the backward
  pass); tuneforge does not checkpoint unless asked.
  `--trl-gradient-checkpointing` keeps TRL's default.
- TRL's logging, evaluation, saving and progress bar are off
  (`logging_strategy="no"`, `eval_strategy="no"`, `save_strategy="no"`,
  `report_to="none"`, `disable_tqdm=True`); its rewards are recorded by the
  reward function itself, its completion lengths by the timer around its
  sampling. tuneforge reports its per-step figures as it always does (a
  `metrics` event per step, to an in-memory reporter here), writes no
  checkpoint, writes its final adapter after the last step (TRL saves
  nothing) and has no validation file.
- The data order and the adapter's random initialisation come from each
  side's own RNG use, so the same seed does not draw the same numbers on both
  sides; the seeds are there to average over.
- Optimizer implementation: tuneforge `torch.optim.AdamW`, TRL the
  Trainer's default (`adamw_torch_fused`): the same update rule.
- tuneforge runs with its defaults otherwise (`packing` on, which has it
  register its variable-length attention; rollouts pass a padding mask, which
  that attention hands to transformers' SDPA). TRL samples with
  transformers' `generate` (no vLLM on a CPU) through the LoRA layers,
  drawing with `torch.multinomial`; tuneforge with its own batched KV-cache
  sampler (`train/sampling.py`: a group's prompt prefilled once, the adapter
  folded into a copy of the weights, a draw as argmax p / E with
  E = -log U, the same distribution). Its loss computes each group's prompt
  once (`train/objectives/reinforcement.py`); TRL's computes every row whole.

    python benchmarks/rft_throughput.py                      # 3 seeds, ~6 min on 2 quiet CPU cores
    python benchmarks/rft_throughput.py --seeds 0 --steps 6  # a quick look

TRL is not a dependency of tuneforge: `pip install --no-deps trl`, then its
missing non-torch dependencies (`pip install datasets pandas accelerate`).
docs/benchmarks-rft.md has the figures and their reading. Nothing here asserts
a time; everything stays on local disk.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_SRC = BENCH_DIR.parent / "src"
# benchmarks/ is not a package; and this checkout's tuneforge is measured, wherever an editable
# install on this machine points (the children inherit it through PYTHONPATH)
sys.path[:0] = [str(REPO_SRC), str(BENCH_DIR)]

SIDES = ("tuneforge", "trl")
GOAL_SPEEDUP = 1.5  # tuneforge's steps/s over TRL's
REWARD_TOLERANCE = 0.02  # "equal" reward: the last steps' mean within this of TRL's (absolute, rewards in [0, 1])
LAST_STEPS = 5  # the reward at the end: the mean of this many last steps
TARGET = "the the the the the the"
WORDS = ["cats", "dogs", "code", "rain", "tea", "maps", "trees", "birds", "music", "bread", "ships", "clocks",
         "rivers", "books", "snow", "lamps", "cars", "stones", "fish", "hats", "clouds", "roads", "keys", "bells",
         "shoes", "coins", "doors", "apples", "chairs", "boats", "kites", "cups"]
PHASES = ("generate_s", "grade_s", "rollout_s", "forward_s", "backward_s")


# -- configuration shared by the parent and the children -----------------------------------------


@dataclass
class Config:
    prompts: int = 24
    prompts_per_step: int = 4
    group_size: int = 8
    max_completion_tokens: int = 24
    steps: int = 30
    learning_rate: float = 1e-2
    lora_rank: int = 16
    lora_alpha: int = 32
    temperature: float = 1.0
    clip_epsilon: float = 0.2
    seed: int = 0
    model_seed: int = 0
    vocab_size: int = 4096
    hidden_size: int = 384
    intermediate_size: int = 1024
    layers: int = 6
    heads: int = 6
    kv_heads: int = 2
    lm_head_std: float = 0.0  # 0: a quarter of the demo's logit scale, 0.125 * sqrt(64 / hidden)
    threads: int = 2
    max_seq_length: int = 256
    trl_gradient_checkpointing: bool = False
    wait_quiet_s: float = 120.0
    workdir: str = ""
    target_modules: list[str] = field(default_factory=list)

    @property
    def epochs(self) -> int:
        """tuneforge counts steps in epochs of the prompt file: `steps` must fill whole epochs."""
        per_epoch = self.prompts // self.prompts_per_step
        if self.prompts % self.prompts_per_step or self.steps % per_epoch:
            raise SystemExit(f"--prompts must be a multiple of --prompts-per-step and --steps a multiple of "
                             f"{per_epoch} (the steps of one pass over the prompts)")
        return self.steps // per_epoch

    @property
    def completions_per_step(self) -> int:
        return self.prompts_per_step * self.group_size

    def head_std(self) -> float:
        # At the demo's scale (0.5 * sqrt(64 / hidden)) a wider random model is nearly deterministic:
        # it repeats one token, scores ~0.1 and GRPO collapses it to 0. A quarter of that scale
        # samples varied text that scores ~0.2 and leaves room to climb.
        return self.lm_head_std or 0.125 * (64 / self.hidden_size) ** 0.5


def paths(cfg: Config) -> dict[str, Path]:
    root = Path(cfg.workdir)
    return {"root": root, "model": root / "model", "prompts": root / "data" / "prompts.jsonl"}


def prompt_lines(cfg: Config) -> list[dict[str, Any]]:
    """Chat prompts ending with a user turn, each naming the grader's reference in `target`."""
    words = [WORDS[i % len(WORDS)] + ("" if i < len(WORDS) else f" {i // len(WORDS) + 1}") for i in range(cfg.prompts)]
    return [{"messages": [{"role": "user", "content": f"Say something about {word}"}], "target": TARGET}
            for word in words]


def fuzzy_reward(text: str, reference: str) -> float:
    """The reward of TRL's side: OpenAI's fuzzy_match as tuneforge's grader computes it."""
    from rapidfuzz import fuzz

    return fuzz.ratio(text, reference) / 100.0


# -- timers shared by both children ----------------------------------------------------------------


class PhaseClock:
    """Seconds spent in named phases and completion counts, snapshotted at the end of each step."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = {phase: 0.0 for phase in PHASES}
        self.totals.update(completion_tokens=0.0, completions=0.0)
        self.rewards: list[list[float]] = []  # one list per grading call (= per step)
        self.started: float | None = None
        self.steps: list[dict[str, float]] = []

    def timed(self, phase: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if self.started is None:
                self.started = time.perf_counter()
            began = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.totals[phase] += time.perf_counter() - began
        return wrapper

    def count_completions(self, token_lists: list[list[int]]) -> None:
        self.totals["completions"] += len(token_lists)
        self.totals["completion_tokens"] += sum(len(ids) for ids in token_lists)

    def step_end(self) -> None:
        # process CPU time too: other work on the machine inflates the wall time more than the CPU time
        self.steps.append({"end": time.perf_counter(), "cpu": time.process_time(), **self.totals})

    def time_backward(self) -> None:
        """Both sides call `Tensor.backward` (TRL through accelerate): time it there."""
        import torch

        torch.Tensor.backward = self.timed("backward_s", torch.Tensor.backward)

    def result(self) -> dict[str, Any]:
        return {"started": self.started, "steps": self.steps, "rewards": self.rewards}


# -- child: tuneforge ------------------------------------------------------------------------------

TENANT, JOB = "bench", "ftjob-rft-throughput"


def grader() -> dict[str, Any]:
    return {"type": "text_similarity", "name": "near", "evaluation_metric": "fuzzy_match",
            "input": "{{sample.output_text}}", "reference": "{{item.target}}"}


def stage_tuneforge(cfg: Config, side_dir: Path) -> Path:
    """A local object store holding the base model and the prompt file, and the JobSpec of a
    reinforcement LoRA job on them, its options resolved as the control plane resolves them;
    returns the spec's path."""
    from tuneforge import methods
    from tuneforge.domain.spec import BaseModelRef, CheckpointPolicy, DataFileRef, Hyperparameters, JobSpec, LoraConfig
    from tuneforge.storage import layout
    from tuneforge.storage.store import open_store

    p = paths(cfg)
    store_url = str(side_dir / "objects")
    store = open_store(store_url)
    model_prefix = layout.base_model_prefix("bench-llama", "0" * 64)
    store.upload_dir(p["model"], model_prefix)
    train_key = layout.file_key(TENANT, "file-prompts", "prompts.jsonl")
    store.put_file(train_key, p["prompts"])
    method = methods.get("reinforcement")
    asked = {"grader": grader(), "samples_per_prompt": cfg.group_size,
             "max_completion_tokens": cfg.max_completion_tokens, "temperature": cfg.temperature, "kl_coef": 0.0,
             "clip_epsilon": cfg.clip_epsilon, "loss_aggregation": "token_mean", "scale_rewards": True}
    options = method.resolve_options(method.parse_hyperparameters(asked)).model_dump()
    hp = Hyperparameters(
        n_epochs=cfg.epochs, batch_size=cfg.prompts_per_step, micro_batch_size=cfg.prompts_per_step,
        gradient_accumulation_steps=1, learning_rate=cfg.learning_rate, warmup_ratio=0.0, lr_scheduler_type="linear",
        weight_decay=0.0, max_grad_norm=1.0, max_seq_length=cfg.max_seq_length, method_options=options,
    )
    spec = JobSpec(
        job_id=JOB, tenant_id=TENANT, attempt=1, seed=cfg.seed,
        base_model=BaseModelRef("bench-llama", "0" * 64, model_prefix),
        training_file=DataFileRef("file-prompts", train_key), validation_file=None,
        method="reinforcement", training_type="lora",
        lora=LoraConfig(rank=cfg.lora_rank, alpha=cfg.lora_alpha, dropout=0.0, target_modules=list(cfg.target_modules)),
        hyperparameters=hp,
        checkpoint=CheckpointPolicy(every_steps=0, keep_last=1, every_minutes=0.0, every_epoch=False),
        storage_url=store_url, callback_url="http://127.0.0.1:9", job_token="bench",
        gpus=0, cache_dir=str(side_dir / "cache"), cpu_threads=cfg.threads,
    )
    spec_path = side_dir / "spec.json"
    spec.write(spec_path)
    return spec_path


def instrument_tuneforge(clock: PhaseClock) -> None:
    """Timers around the functions of tuneforge's GRPO step (pass-through wrappers)."""
    from tuneforge.train import rollout, sampling
    from tuneforge.train.objectives.reinforcement import ReinforcementObjective

    def counted_sample(*args: Any, **kwargs: Any) -> Any:
        completions = original_sample(*args, **kwargs)
        clock.count_completions(completions.token_ids)
        return completions

    def recorded_grade(self: Any, texts: list[str], items: list[dict[str, Any]]) -> Any:
        results = original_grade(self, texts, items)
        clock.rewards.append([result.reward for result in results])
        return results

    original_sample, original_grade = sampling.sample, ReinforcementObjective._grade
    sampling.sample = clock.timed("generate_s", counted_sample)
    ReinforcementObjective._grade = clock.timed("grade_s", recorded_grade)
    ReinforcementObjective.forward = clock.timed("forward_s", ReinforcementObjective.forward)
    rollout.prepare = clock.timed("rollout_s", rollout.prepare)
    clock.time_backward()


def run_tuneforge_side(cfg: Config, side_dir: Path) -> dict[str, Any]:
    # the libraries the trainer imports lazily are imported before the clock starts, as on the TRL side
    import peft  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401

    from tuneforge.domain.spec import JobSpec
    from tuneforge.storage.store import open_store
    from tuneforge.train.reporter import RecordingReporter
    from tuneforge.train.runner import run_attempt

    started = time.perf_counter()
    clock = PhaseClock()
    instrument_tuneforge(clock)
    spec = JobSpec.read(side_dir / "spec.json")
    store = open_store(spec.storage_url)

    class TimedReporter(RecordingReporter):
        def progress(self, step: int, total_steps: int) -> None:
            clock.step_end()
            super().progress(step, total_steps)

    reporter = TimedReporter()
    exit_code = run_attempt(spec, store, reporter)
    if int(exit_code) != 0:
        raise RuntimeError(f"run_attempt exited {exit_code!r}: {reporter.reports[-3:]}")
    metrics = [event["data"] for event in reporter.of_kind("events") if event.get("type") == "metrics"]
    started_event = next(body for body in reporter.of_kind("events") if body.get("type") == "message"
                         and "threads" in body.get("data", {}))
    return {**clock.result(), "end_to_end_s": time.perf_counter() - started,
            "event_rewards": [m.get("reward_mean") for m in metrics],
            "threads": started_event["data"]["threads"], "prompt_ids": tuneforge_prompt_ids(cfg)}


def tuneforge_prompt_ids(cfg: Config) -> list[list[int]]:
    """The prompts as tuneforge's objective renders them (for the check against TRL's)."""
    from transformers import AutoTokenizer

    from tuneforge.train.objectives.reinforcement import _prompt_ids

    tokenizer = AutoTokenizer.from_pretrained(paths(cfg)["model"])
    return [_prompt_ids(tokenizer, line) for line in prompt_lines(cfg)]


# -- child: TRL ------------------------------------------------------------------------------------


def trl_config(cfg: Config, side_dir: Path) -> Any:
    """GRPOConfig: what must equal tuneforge's, then TRL on a CPU as its docs set it up."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(side_dir / "out"),
        # the same GRPO as tuneforge's
        num_generations=cfg.group_size, generation_batch_size=cfg.completions_per_step,
        per_device_train_batch_size=cfg.completions_per_step, gradient_accumulation_steps=1,
        max_completion_length=cfg.max_completion_tokens, temperature=cfg.temperature, top_p=1.0, top_k=0,
        max_steps=cfg.steps, learning_rate=cfg.learning_rate, lr_scheduler_type="linear", warmup_steps=0,
        weight_decay=0.0, max_grad_norm=1.0, seed=cfg.seed, beta=0.0, epsilon=cfg.clip_epsilon,
        loss_type="dapo", scale_rewards="group", num_iterations=1,
        model_init_kwargs={"dtype": "float32"},
        # a CPU, float32 like tuneforge's trainer on a CPU; see the docstring for gradient checkpointing
        use_cpu=True, bf16=False, gradient_checkpointing=cfg.trl_gradient_checkpointing,
        # no logging service, progress bar, evaluation or checkpoints
        report_to="none", logging_strategy="no", disable_tqdm=True, eval_strategy="no", save_strategy="no",
    )


def run_trl_side(cfg: Config, side_dir: Path) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback, set_seed
    from trl import GRPOTrainer

    torch.set_num_threads(cfg.threads)
    started = time.perf_counter()
    set_seed(cfg.seed)  # the adapter's initialisation happens before the Trainer seeds itself
    clock = PhaseClock()
    lines = prompt_lines(cfg)
    dataset = Dataset.from_list([{"prompt": line["messages"], "target": line["target"]} for line in lines])

    def near_target(completions: list[Any], target: list[str], **_: Any) -> list[float]:
        began = time.perf_counter()
        rewards = [fuzzy_reward(completion[0]["content"], reference)  # a conversational completion: one message
                   for completion, reference in zip(completions, target)]
        clock.totals["grade_s"] += time.perf_counter() - began
        clock.rewards.append(rewards)
        return rewards

    args = trl_config(cfg, side_dir)
    lora = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=0.0,
                      target_modules=list(cfg.target_modules), task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model=str(paths(cfg)["model"]), args=args, reward_funcs=near_target,
                          train_dataset=dataset, peft_config=lora)
    instrument_trl(trainer, clock)

    class StepClock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001
            clock.step_end()

    trainer.add_callback(StepClock())
    prompt_ids = trainer._tokenize_prompts([line["messages"] for line in lines])[0]
    trainer.train()
    return {**clock.result(), "end_to_end_s": time.perf_counter() - started, "threads": torch.get_num_threads(),
            "prompt_ids": [list(map(int, ids)) for ids in prompt_ids], "settings": trl_settings(trainer)}


def instrument_trl(trainer: Any, clock: PhaseClock) -> None:
    """Timers around the methods of TRL's GRPO step (pass-through wrappers on the instance)."""
    generate = trainer._generate_single_turn

    def counted_generate(*args: Any, **kwargs: Any) -> Any:
        completion_ids, logprobs = generate(*args, **kwargs)
        clock.count_completions(completion_ids)
        return completion_ids, logprobs

    trainer._generate_single_turn = clock.timed("generate_s", counted_generate)
    trainer._generate_and_score_completions = clock.timed("rollout_s", trainer._generate_and_score_completions)
    trainer._compute_loss = clock.timed("forward_s", trainer._compute_loss)
    clock.time_backward()


def trl_settings(trainer: Any) -> dict[str, Any]:
    args = trainer.args
    names = ("use_cpu", "bf16", "gradient_checkpointing", "num_generations", "generation_batch_size",
             "steps_per_generation", "num_iterations", "per_device_train_batch_size", "gradient_accumulation_steps",
             "max_completion_length", "temperature", "top_k", "top_p", "beta", "epsilon", "loss_type",
             "scale_rewards", "learning_rate", "lr_scheduler_type", "optim", "max_grad_norm", "max_steps",
             "use_vllm", "use_transformers_continuous_batching", "mask_truncated_completions", "logging_strategy")
    return {name: str(getattr(args, name)) for name in names}


def child_main(side: str, cfg: Config) -> None:
    side_dir = Path(cfg.workdir) / f"{side}-seed{cfg.seed}"
    result = run_tuneforge_side(cfg, side_dir) if side == "tuneforge" else run_trl_side(cfg, side_dir)
    (side_dir / "result.json").write_text(json.dumps(result))


# -- parent: running the children ------------------------------------------------------------------


def child_env(cfg: Config, side_dir: Path) -> dict[str, str]:
    from harness import isolated_child_env

    return isolated_child_env(side_dir, cfg.threads, cpu_only=True, extra={"PYTHONPATH": str(REPO_SRC)})


def run_child(side: str, cfg: Config) -> dict[str, Any]:
    from harness import read_machine_cpu_s, run_measured

    side_dir = Path(cfg.workdir) / f"{side}-seed{cfg.seed}"
    side_dir.mkdir(parents=True, exist_ok=True)
    (side_dir / "config.json").write_text(json.dumps(asdict(cfg)))
    if side == "tuneforge":
        stage_tuneforge(cfg, side_dir)
    busy_before = read_machine_cpu_s()[0]
    wall, usage = run_measured([sys.executable, __file__, "--side", side, "--config", str(side_dir / "config.json")],
                               child_env(cfg, side_dir), side_dir / "child.log", f"side {side} (seed {cfg.seed})")
    result = json.loads((side_dir / "result.json").read_text())
    child_cpu_s = usage.ru_utime + usage.ru_stime
    # CPU time the rest of the machine used while this side ran: other work skews the figures
    others_cpu_s = max(0.0, read_machine_cpu_s()[0] - busy_before - child_cpu_s)
    result.update({"side": side, "seed": cfg.seed, "process_s": wall, "child_cpu_s": child_cpu_s,
                   "others_cores": others_cpu_s / wall, "peak_rss_mib": usage.ru_maxrss / 1024})
    return result


# -- parent: the figures ---------------------------------------------------------------------------


def summarise(r: dict[str, Any]) -> dict[str, Any]:
    """One side's run: per-step times, throughput after the first step, phases, reward curve."""
    steps, started = r["steps"], r["started"]
    ends = [s["end"] for s in steps]
    durations = [ends[0] - started] + [after - before for before, after in zip(ends, ends[1:])]
    later = len(steps) - 1  # the steps after the first
    span_s = ends[-1] - ends[0]

    def per_step(name: str) -> float:
        return (steps[-1][name] - steps[0][name]) / later

    phases = {name: per_step(name) for name in PHASES}
    phases["other_rollout_s"] = phases["rollout_s"] - phases["generate_s"] - phases["grade_s"]
    s_per_step = statistics.mean(durations[1:])
    phases["rest_s"] = s_per_step - phases["rollout_s"] - phases["forward_s"] - phases["backward_s"]
    rewards = [statistics.mean(call) for call in r["rewards"]]
    completion_tokens = steps[-1]["completion_tokens"] - steps[0]["completion_tokens"]
    return {
        "steps": len(steps), "first_step_s": durations[0], "s_per_step": s_per_step, "steps_per_s": 1 / s_per_step,
        "median_s_per_step": statistics.median(durations[1:]),
        "cpu_s_per_step": (steps[-1]["cpu"] - steps[0]["cpu"]) / later,
        "completion_tokens_per_s": completion_tokens / span_s,
        "mean_completion_tokens": steps[-1]["completion_tokens"] / max(1.0, steps[-1]["completions"]),
        "phases": phases, "rewards": rewards, "last_reward": statistics.mean(rewards[-LAST_STEPS:]),
        "first_reward": rewards[0], "end_to_end_s": r["end_to_end_s"], "process_s": r["process_s"],
        "others_cores": r["others_cores"], "peak_rss_mib": r["peak_rss_mib"], "threads": r["threads"],
    }


def check_lines(raw: dict[str, dict[str, Any]], cfg: Config) -> list[str]:
    """What the two sides of one seed must agree on, said in words (nothing stops the run)."""
    tf, trl = raw["tuneforge"], raw["trl"]
    lines = []
    same = tf["prompt_ids"] == trl["prompt_ids"]
    lines.append(f"check: prompt token ids {'identical' if same else 'DIFFERENT'} on both sides "
                 f"({len(tf['prompt_ids'][0])}-{max(map(len, tf['prompt_ids']))} tokens)")
    for side, r in raw.items():
        graded = sum(len(call) for call in r["rewards"])
        expected = cfg.steps * cfg.completions_per_step
        lines.append(f"check {side}: {len(r['steps'])} steps, {len(r['rewards'])} grading calls, {graded} completions "
                     f"graded ({'as expected' if graded == expected else f'EXPECTED {expected}'})")
    recorded = [statistics.mean(call) for call in tf["rewards"]]
    drift = max(abs(a - b) for a, b in zip(recorded, tf["event_rewards"]))
    lines.append(f"check tuneforge: its metrics events' reward_mean matches the grader's results "
                 f"(largest difference {drift:.1e})")
    return lines


def side_table(summaries: dict[str, dict[str, Any]]) -> list[str]:
    last = f"last {LAST_STEPS}"
    header = (f"{'side':<10} {'s/step':>7} {'median':>7} {'CPU s':>6} {'steps/s':>8} {'compl tok/s':>11} "
              f"{'tok/compl':>9} {'step 1 s':>8} {'reward 1':>8} {last:>7} {'RSS MiB':>8} {'others':>7}")
    lines = [header, "-" * len(header)]
    for side, s in summaries.items():
        lines.append(f"{side:<10} {s['s_per_step']:>7.3f} {s['median_s_per_step']:>7.3f} {s['cpu_s_per_step']:>6.2f} "
                     f"{s['steps_per_s']:>8.3f} {s['completion_tokens_per_s']:>11.0f} "
                     f"{s['mean_completion_tokens']:>9.1f} "
                     f"{s['first_step_s']:>8.2f} {s['first_reward']:>8.3f} {s['last_reward']:>7.3f} "
                     f"{s['peak_rss_mib']:>8.0f} {s['others_cores']:>6.2f}c")
    lines.append("  (s/step: mean wall time of the steps after the first; median: their median; CPU s: process "
                 "CPU seconds per step, all threads; others: cores the rest of the machine used meanwhile)")
    for side, s in summaries.items():
        p = s["phases"]
        lines.append(f"  {side} per step: generate {p['generate_s']:.3f} s, grade {p['grade_s']:.4f} s, "
                     f"other rollout {p['other_rollout_s']:.3f} s, loss forward {p['forward_s']:.3f} s, "
                     f"backward {p['backward_s']:.3f} s, rest {p['rest_s']:.3f} s")
    for side, s in summaries.items():
        lines.append(f"  {side} reward curve: {' '.join(f'{value:.2f}' for value in s['rewards'])}")
    return lines


def comparison_line(tf: dict[str, Any], trl: dict[str, Any]) -> str:
    speedup = tf["steps_per_s"] / trl["steps_per_s"]
    delta = tf["last_reward"] - trl["last_reward"]
    tokens = tf["completion_tokens_per_s"] / trl["completion_tokens_per_s"]
    return (f"tuneforge / TRL steps per second: {speedup:.2f}x; completion tokens/s {tokens:.2f}x; "
            f"reward of the last {LAST_STEPS} steps: tuneforge {tf['last_reward']:.3f}, TRL {trl['last_reward']:.3f} "
            f"({delta:+.3f})")


def overall_lines(per_seed: list[dict[str, dict[str, Any]]]) -> list[str]:
    """The figures over the seeds, the mean reward curve per side and the goal."""
    sides = {side: [seed[side] for seed in per_seed] for side in SIDES}
    mean = {side: {key: statistics.mean(s[key] for s in runs) for key in
                   ("s_per_step", "steps_per_s", "completion_tokens_per_s", "last_reward", "first_reward")}
            for side, runs in sides.items()}
    ratios = [seed["tuneforge"]["steps_per_s"] / seed["trl"]["steps_per_s"] for seed in per_seed]
    lines = [f"over {len(per_seed)} seed(s):"]
    for side, m in mean.items():
        phases = {name: statistics.mean(s["phases"][name] for s in sides[side]) for name in sides[side][0]["phases"]}
        lines.append(f"  {side:<10} {m['s_per_step']:.3f} s/step ({m['steps_per_s']:.3f} steps/s), "
                     f"{m['completion_tokens_per_s']:.0f} completion tok/s, reward step 1 {m['first_reward']:.3f}, "
                     f"last {LAST_STEPS} steps {m['last_reward']:.3f}; "
                     f"per step: generate {phases['generate_s']:.3f} s, "
                     f"grade {phases['grade_s']:.4f} s, other rollout {phases['other_rollout_s']:.3f} s, "
                     f"loss forward {phases['forward_s']:.3f} s, backward {phases['backward_s']:.3f} s, "
                     f"rest {phases['rest_s']:.3f} s")
        curve = [statistics.mean(values) for values in zip(*(s["rewards"] for s in sides[side]))]
        lines.append(f"  {side:<10} mean reward curve: {' '.join(f'{value:.2f}' for value in curve)}")
    speedup = mean["tuneforge"]["steps_per_s"] / mean["trl"]["steps_per_s"]
    delta = mean["tuneforge"]["last_reward"] - mean["trl"]["last_reward"]
    lines.append(f"  tuneforge / TRL steps per second: {speedup:.2f}x on the means (per seed: "
                 f"{', '.join(f'{ratio:.2f}x' for ratio in ratios)}; geometric mean "
                 f"{statistics.geometric_mean(ratios):.2f}x)")
    lines.append(f"  reward of the last {LAST_STEPS} steps: tuneforge {mean['tuneforge']['last_reward']:.3f}, "
                 f"TRL {mean['trl']['last_reward']:.3f} ({delta:+.3f})")
    fast = min(ratios) >= GOAL_SPEEDUP
    reward_ok = delta >= -REWARD_TOLERANCE
    lines.append(f"goal (>= {GOAL_SPEEDUP:g}x TRL's steps/s on every seed, last-{LAST_STEPS}-step reward equal or "
                 f"better over the seeds, equal = within {REWARD_TOLERANCE:g}): speed {'MET' if fast else 'NOT MET'}, "
                 f"reward {'MET' if reward_ok else 'NOT MET'}")
    return lines


def build_model(cfg: Config) -> list[str]:
    """The base model, once for every seed and side; fills `cfg.target_modules`; describes it."""
    import torch
    from transformers import AutoModelForCausalLM

    from tuneforge.demo.tiny_model import build_tiny_model, count_parameters
    from tuneforge.train.model import linear_module_names

    model_dir = paths(cfg)["model"]
    head_std = cfg.head_std()
    build_tiny_model(model_dir, seed=cfg.model_seed, vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                     intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.layers,
                     num_attention_heads=cfg.heads, num_key_value_heads=cfg.kv_heads,
                     max_position_embeddings=max(512, cfg.max_seq_length), lm_head_init_std=head_std)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    cfg.target_modules = linear_module_names(model)  # every nn.Linear but the head, on both sides
    c, params = model.config, count_parameters(model)
    return [f"model:     random-weight Llama, {params:,} parameters: vocab {c.vocab_size}, hidden {c.hidden_size}, "
            f"{c.num_hidden_layers} layers, {c.num_attention_heads} heads / {c.num_key_value_heads} KV heads, "
            f"MLP {c.intermediate_size}, untied head drawn with std {head_std:.3f}; seed {cfg.model_seed}"]


def run_seed(cfg: Config, seed: int, order: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    from train_throughput import wait_for_quiet

    cfg.seed = seed
    raw: dict[str, dict[str, Any]] = {}
    for side in order:
        if cfg.wait_quiet_s > 0:
            print(f"waiting for the machine to be quiet before {side}: {wait_for_quiet(cfg.wait_quiet_s)}", flush=True)
        print(f"running {side}, seed {seed} ...", flush=True)
        raw[side] = run_child(side, cfg)
        r = raw[side]
        print(f"  done in {r['process_s']:.1f} s (process); other processes used {r['others_cores']:.2f} cores "
              f"meanwhile{' - CONTENDED: its times are inflated' if r['others_cores'] > 0.25 else ''}", flush=True)
    return {side: raw[side] for side in SIDES}


def parent_main(cfg: Config, seeds: list[int], keep: bool, json_out: str) -> None:
    import warnings

    from train_throughput import machine_lines
    from transformers.utils import logging as hf_logging

    import tuneforge

    hf_logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning)
    for line in machine_lines():
        print(line)
    print(f"code:      {Path(tuneforge.__file__).parent}")
    root = Path(tempfile.mkdtemp(prefix="tuneforge-rft-bench-"))
    cfg.workdir = str(root)
    try:
        for line in build_model(cfg):
            print(line)
        lines = prompt_lines(cfg)
        paths(cfg)["prompts"].parent.mkdir(parents=True, exist_ok=True)
        paths(cfg)["prompts"].write_text("".join(json.dumps(line) + "\n" for line in lines))
        print(f"prompts:   {cfg.prompts} chat prompts ('{lines[0]['messages'][0]['content']}', ...), reward "
              f"fuzzy_match(completion, '{TARGET}'); {cfg.prompts_per_step} prompts x {cfg.group_size} completions "
              f"per step, at most {cfg.max_completion_tokens} tokens, temperature {cfg.temperature:g}; "
              f"{cfg.steps} steps")
        print(f"training:  LoRA r={cfg.lora_rank} alpha={cfg.lora_alpha} dropout 0 on {', '.join(cfg.target_modules)}; "
              f"AdamW lr {cfg.learning_rate:g}, linear decay, no warmup, grad clip 1.0; no KL; token-mean loss; "
              f"{cfg.threads} torch threads; TRL gradient checkpointing "
              f"{'on' if cfg.trl_gradient_checkpointing else 'off'}")
        print(f"seeds:     {', '.join(map(str, seeds))}")
        per_seed, raw_all = [], []
        for index, seed in enumerate(seeds):
            print()
            order = SIDES if index % 2 == 0 else tuple(reversed(SIDES))  # alternate who runs first
            raw = run_seed(cfg, seed, order)
            summaries = {side: summarise(r) for side, r in raw.items()}
            print()
            print(f"seed {seed}:")
            for line in check_lines(raw, cfg) + side_table(summaries):
                print(line)
            print(comparison_line(summaries["tuneforge"], summaries["trl"]))
            if index == 0:
                print(f"TRL settings in effect: {json.dumps(raw['trl']['settings'], sort_keys=True)}")
            per_seed.append(summaries)
            raw_all.append({side: {k: v for k, v in r.items() if k != "prompt_ids"} for side, r in raw.items()})
        print()
        for line in overall_lines(per_seed):
            print(line)
        report = {"config": asdict(cfg), "seeds": seeds, "summaries": per_seed, "raw": raw_all}
        (root / "summary.json").write_text(json.dumps(report))
        if json_out:
            Path(json_out).write_text(json.dumps(report, indent=1))
        if keep:
            print(f"\nkept: {root}")
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    d = Config()
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated; each runs both sides")
    parser.add_argument("--steps", type=int, default=d.steps, help="optimizer steps per run")
    parser.add_argument("--prompts", type=int, default=d.prompts, help="prompts in the training file")
    parser.add_argument("--prompts-per-step", type=int, default=d.prompts_per_step)
    parser.add_argument("--group-size", type=int, default=d.group_size, help="completions sampled per prompt")
    parser.add_argument("--max-completion-tokens", type=int, default=d.max_completion_tokens)
    parser.add_argument("--learning-rate", type=float, default=d.learning_rate)
    parser.add_argument("--lora-rank", type=int, default=d.lora_rank)
    parser.add_argument("--lora-alpha", type=int, default=d.lora_alpha)
    parser.add_argument("--model-seed", type=int, default=d.model_seed, help="seed of the random base model")
    parser.add_argument("--vocab-size", type=int, default=d.vocab_size)
    parser.add_argument("--hidden-size", type=int, default=d.hidden_size)
    parser.add_argument("--intermediate-size", type=int, default=d.intermediate_size)
    parser.add_argument("--layers", type=int, default=d.layers)
    parser.add_argument("--heads", type=int, default=d.heads)
    parser.add_argument("--kv-heads", type=int, default=d.kv_heads)
    parser.add_argument("--lm-head-std", type=float, default=d.lm_head_std,
                        help="std of the random output head (0: 0.125 * sqrt(64 / hidden), a quarter of the demo's)")
    parser.add_argument("--threads", type=int, default=d.threads, help="torch threads on both sides")
    parser.add_argument("--trl-gradient-checkpointing", action="store_true",
                        help="keep GRPOConfig's default gradient_checkpointing=True")
    parser.add_argument("--wait-quiet", type=float, default=d.wait_quiet_s,
                        help="before each side, wait up to this many seconds for other processes to go quiet")
    parser.add_argument("--json-out", default="", help="also write every figure to this file")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (model, data, logs)")
    parser.add_argument("--side", help=argparse.SUPPRESS)  # a child process
    parser.add_argument("--config", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        child_main(args.side, Config(**json.loads(Path(args.config).read_text())))
        return
    try:
        import trl  # noqa: F401
    except ImportError:
        parser.error("TRL is not installed: pip install --no-deps trl && pip install datasets pandas accelerate")
    cfg = Config(
        prompts=args.prompts, prompts_per_step=args.prompts_per_step, group_size=args.group_size,
        max_completion_tokens=args.max_completion_tokens, steps=args.steps, learning_rate=args.learning_rate,
        lora_rank=args.lora_rank, lora_alpha=args.lora_alpha, model_seed=args.model_seed, vocab_size=args.vocab_size,
        hidden_size=args.hidden_size, intermediate_size=args.intermediate_size, layers=args.layers, heads=args.heads,
        kv_heads=args.kv_heads, lm_head_std=args.lm_head_std, threads=args.threads,
        trl_gradient_checkpointing=args.trl_gradient_checkpointing,
        wait_quiet_s=args.wait_quiet,
    )
    _ = cfg.epochs  # validates the step count early
    if args.steps < 2:
        parser.error("--steps must be at least 2 (the first step is not timed)")
    parent_main(cfg, [int(seed) for seed in args.seeds.split(",") if seed.strip()], args.keep, args.json_out)


if __name__ == "__main__":
    main()
