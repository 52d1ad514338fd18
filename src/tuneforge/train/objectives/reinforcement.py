"""Reinforcement fine-tuning (`reinforcement`): GRPO on completions the policy samples, scored by a grader.

Data: prompt lines, `{"messages": [... the user's turn last], <fields>}`;
the whole line is the grader's `item`. A prompt is rendered with the chat
template and the assistant's turn opened, and keeps its last
`max_seq_length - completion tokens` tokens.

A step (`prepare_step`, the loop's rollout phase):
1. sample `group_size` completions for each of the step's prompts from the
   current policy (`train/sampling.py`: batched, KV cache, the step's seeded
   generator — a resumed attempt samples the same);
2. grade them (`graders/score.py`) in `GRADER_WORKERS` threads, python graders
   each in a sandbox process; a sample the grader fails on scores 0 and counts
   in `grader_error_rate`; past `max_grader_error_rate` on two steps in a row
   the job fails as the grader's (the tenant's) fault;
3. advantages: each reward minus its group's mean, divided by the group's
   standard deviation (`scale_rewards`; + 1e-4).

The loss of a completion token t (`forward`), with ratio = pi(t) / pi_old(t):

    -min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A) + kl_coef * KL_t

pi_old is the policy that sampled, which is the policy being optimised (one
update per batch of rollouts), so the ratio is 1 with the policy gradient as
its gradient; KL_t is the k3 estimate exp(r - p) - (r - p) - 1 against the
base model (the adapter turned off: LoRA jobs only). Aggregation: `token_mean`
divides the step's summed token losses by its completion tokens,
`sequence_mean` averages each completion's tokens and then the completions,
`constant` divides the sum by completions x max completion tokens.

Validation (every `eval_interval` steps, on `eval_samples` prompts): one
sample per prompt, graded; it reports `valid_reward_mean`. Accuracy is the
share of samples whose reward is at least 0.5.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.nn.functional as F

from tuneforge.data.errors import BadDataError
from tuneforge.domain.graders import has_type
from tuneforge.domain.spec import DataFileRef, Hyperparameters
from tuneforge.eval.judges import embeddings_for, uses_cosine
from tuneforge.graders import check, score
from tuneforge.graders.templates import Sample
from tuneforge.methods.reinforcement import ReinforcementOptions
from tuneforge.modeling.errors import UserInputError
from tuneforge.train import pairs, sampling
from tuneforge.train.objective import Scores, StepContext

log = logging.getLogger(__name__)

GRADER_WORKERS = 4
MAX_VALIDATION_PROMPTS = 64
FAILING_STEPS = 2  # steps in a row past max_grader_error_rate that fail the job
_METRIC_CHARS = re.compile(r"[^a-z0-9_]+")


@dataclass(frozen=True)
class PromptExample:
    prompt_ids: list[int]
    item: dict[str, Any]


@dataclass(frozen=True)
class Rollout:
    prompt_ids: list[int]
    completion_ids: list[int]
    advantage: float
    reward: float
    metrics: Mapping[str, float] = field(default_factory=dict)  # this sample's share of the step's figures


def metric_name(grader_name: str) -> str:
    """A sub-grader's reward figure: `reward_<name>` in the characters a metric name may use."""
    return ("reward_" + _METRIC_CHARS.sub("_", grader_name.lower()).strip("_"))[:64]


class ReinforcementObjective:
    name = "reinforcement"

    def __init__(self, options: ReinforcementOptions, tools: score.GradingTools | None = None) -> None:
        self.options = options
        self.grader = check.parse(options.grader, "method.reinforcement.grader")
        self.tools = tools
        self.failing_steps = 0
        self.eos_ids: set[int] = set()
        self.pad_id = 0
        self.vllm: Any = None  # rollouts on vLLM (train/vllm_rollouts.py), where the operator enabled them

    # -- data ---------------------------------------------------------------------------------

    def load(self, store: Any, ref: DataFileRef, tokenizer: Any, hp: Hyperparameters, *, label: str,
             base_model_sha256: str) -> list[PromptExample]:
        self.eos_ids = _eos_ids(tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos_ids)
        room = max(1, hp.max_seq_length - self.options.completion_tokens)
        examples = []
        for line, record in pairs.read_records(store, ref, label=label):
            missing = check.missing_fields(self.grader, record)
            if missing:
                raise BadDataError("missing_field", f"{label} file: the line has no field '{missing[0]}', which the "
                                   "grader reads", line_number=line, param=missing[0])
            ids = _prompt_ids(tokenizer, record)
            examples.append(PromptExample(ids[-room:], record))
        if not examples:
            raise BadDataError("empty_file", f"the {label} file has no examples")
        return examples

    def prepare(self, run: Any) -> None:
        if self.tools is None:
            self.tools = default_tools(run.spec, self.grader)
        self.vllm = _vllm_rollouts(run, self.options)

    def validate_every(self, total_steps: int) -> int:
        """Steps between validations: `eval_interval`, else a tenth of the steps."""
        return self.options.eval_interval or max(1, total_steps // 10)

    # -- the rollout phase --------------------------------------------------------------------

    def prepare_step(self, examples: list[PromptExample], context: StepContext) -> list[Rollout]:
        if context.validation:
            count = self.options.eval_samples or MAX_VALIDATION_PROMPTS
            examples, group = examples[:count], 1
        else:
            group = self.options.group_size
        prompts = [example.prompt_ids for example in examples for _ in range(group)]
        if self.vllm is not None:
            completions = self.vllm.sample(context.model, prompts, max_new_tokens=self.options.completion_tokens,
                                           temperature=self.options.temperature, eos_ids=self.eos_ids,
                                           generator=context.generator)
        else:
            completions = sampling.sample(
                context.model, prompts, max_new_tokens=self.options.completion_tokens,
                temperature=self.options.temperature, eos_ids=self.eos_ids, pad_id=self.pad_id,
                generator=context.generator, device=context.device,
                json_tokenizer=context.tokenizer if self.options.response_format else None)
        texts = [context.tokenizer.decode(ids, skip_special_tokens=True) for ids in completions.token_ids]
        items = [example.item for example in examples for _ in range(group)]
        results = self._grade(texts, items)
        errors = sum(result.errors.any() for result in results) / len(results)
        if not context.validation:
            self._check_errors(errors, context.step)
        rewards = torch.tensor([result.reward for result in results], dtype=torch.float64).view(-1, group)
        advantages = self._advantages(rewards) if group > 1 else torch.zeros_like(rewards)
        step_figures: dict[str, float] = {"grader_error_rate": errors}
        if group > 1:  # the spread within groups: what the advantages are made of
            spread = rewards.std(dim=1, unbiased=False)
            step_figures["reward_std"] = float(spread.mean())
            step_figures["zero_variance_groups"] = float((spread < 1e-9).double().mean())
        rollouts = []
        for index, (ids, result) in enumerate(zip(completions.token_ids, results)):
            figures = {"reward_mean": result.reward, "completion_length": float(len(ids)),
                       "completion_stopped": float(completions.stopped[index]), **step_figures}
            if context.validation:
                figures.pop("completion_stopped")
            if len(result.sub_rewards) > 1 or next(iter(result.sub_rewards)) != self.grader.name:
                figures.update({metric_name(name): value for name, value in result.sub_rewards.items()})
            if context.validation:
                figures = {f"valid_{name}": value for name, value in figures.items()}
            rollouts.append(Rollout(prompts[index], ids or [self.pad_id], float(advantages.view(-1)[index]),
                                    result.reward, figures))
        return rollouts

    def _grade(self, texts: list[str], items: list[dict[str, Any]]) -> list[score.GraderResult]:
        tools = self.tools if self.tools is not None else score.GradingTools()
        samples = [Sample.from_text(text) for text in texts]
        workers = max(1, min(GRADER_WORKERS, len(samples)))
        size = math.ceil(len(samples) / workers)
        parts = [(samples[start:start + size], items[start:start + size]) for start in range(0, len(samples), size)]
        with ThreadPoolExecutor(max_workers=len(parts), thread_name_prefix="grader") as pool:
            done = pool.map(lambda part: score.score_batch(self.grader, part[0], part[1], tools), parts)
            return [result for part in done for result in part]

    def _advantages(self, rewards: torch.Tensor) -> torch.Tensor:
        centred = rewards - rewards.mean(dim=1, keepdim=True)
        if self.options.scale_rewards:
            centred = centred / (rewards.std(dim=1, unbiased=False, keepdim=True) + 1e-4)
        return centred

    def _check_errors(self, error_rate: float, step: int) -> None:
        if error_rate <= self.options.max_grader_error_rate:
            self.failing_steps = 0
            return
        self.failing_steps += 1
        if self.failing_steps >= FAILING_STEPS:
            raise UserInputError(
                "grader_failed", f"the grader failed on {error_rate:.0%} of the samples of step {step} and of the "
                f"step before (max_grader_error_rate is {self.options.max_grader_error_rate:g}); check it with "
                "POST /v1/fine_tuning/alpha/graders/run", param="method.reinforcement.grader")

    # -- scoring ------------------------------------------------------------------------------

    def units(self, examples: list[Rollout]) -> int:
        if self.options.loss_aggregation == "token_mean":
            return sum(len(rollout.completion_ids) for rollout in examples)
        if self.options.loss_aggregation == "constant":
            return len(examples) * self.options.completion_tokens
        return len(examples)

    def chunks(self, examples: list[Rollout], hp: Hyperparameters) -> list[list[Rollout]]:
        size = max(1, hp.micro_batch_size) * self.options.group_size
        return [examples[start:start + size] for start in range(0, len(examples), size)]

    def forward(self, run: Any, chunk: list[Rollout]) -> Scores:
        batch = _batch(chunk, self.pad_id, run.device)
        shared = _Shared(chunk, self.options.group_size, self.pad_id)
        logps = _token_logps(run.model, batch, shared)
        mask = batch.targets_mask
        advantages = torch.tensor([rollout.advantage for rollout in chunk], dtype=logps.dtype,
                                  device=logps.device).unsqueeze(1)
        ratio = torch.exp(logps - logps.detach())
        eps = self.options.clip_epsilon
        clipped = torch.clamp(ratio, 1 - eps, 1 + eps)
        token_losses = -torch.minimum(ratio * advantages, clipped * advantages)
        training = torch.is_grad_enabled()  # (validation scores without gradients and reports its own figures)
        metrics: dict[str, float] = {}
        if self.options.kl_coef > 0:
            kl = _k3(run.model, batch, logps, shared)
            token_losses = token_losses + self.options.kl_coef * kl
            if training:
                metrics["kl"] = float(((kl * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)).sum())
        token_losses = token_losses * mask
        if self.options.loss_aggregation == "sequence_mean":
            loss_sum = (token_losses.sum(dim=1) / mask.sum(dim=1).clamp(min=1)).sum()
        else:
            loss_sum = token_losses.sum()
        if training:
            clipped_tokens = ((ratio - clipped).abs() > 0) & (mask > 0)
            metrics["clip_fraction"] = float(clipped_tokens.sum() / mask.sum().clamp(min=1)) * len(chunk)
        for rollout in chunk:
            for name, value in rollout.metrics.items():
                metrics[name] = metrics.get(name, 0.0) + value
        correct = sum(rollout.reward >= 0.5 for rollout in chunk)
        return Scores(loss_sum, correct, len(chunk), int(batch.attention.sum()), batch.attention.numel(), metrics)


@dataclass(frozen=True)
class _Batch:
    ids: torch.Tensor
    attention: torch.Tensor
    targets: torch.Tensor  # the next token at each position (completion positions only count)
    targets_mask: torch.Tensor  # 1 where the next token is a completion token


def _batch(chunk: list[Rollout], pad_id: int, device: torch.device) -> _Batch:
    """Right-padded prompt + completion rows; targets are shifted by one, the completion's only."""
    width = max(len(rollout.prompt_ids) + len(rollout.completion_ids) for rollout in chunk)
    ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(chunk), width), dtype=torch.long)
    targets_mask = torch.zeros((len(chunk), width - 1), dtype=torch.float32)
    for row, rollout in enumerate(chunk):
        sequence = rollout.prompt_ids + rollout.completion_ids
        ids[row, :len(sequence)] = torch.tensor(sequence)
        attention[row, :len(sequence)] = 1
        targets_mask[row, len(rollout.prompt_ids) - 1:len(sequence) - 1] = 1
    ids, attention = ids.to(device), attention.to(device)
    return _Batch(ids, attention, ids[:, 1:], targets_mask.to(device))


@dataclass(frozen=True)
class _Shared:
    """A chunk's rollouts, in groups of `group` rows sharing their prompt."""

    chunk: list[Rollout]
    group: int
    pad_id: int


def _token_logps(model: Any, batch: _Batch, shared: _Shared | None = None) -> torch.Tensor:
    """log pi(next token), (rows, width - 1): at the completion's positions, 0 elsewhere. The output
    layer runs on the completion's positions only (`train/fused_loss.py`'s hidden states): a prompt's
    logits, rows x prompt x vocab of them, are never made. Where the model post-processes its logits
    in a way the fused path does not reproduce, every position's logits are computed. With `shared`,
    each group's prompt is computed once (`_shared_prompts`)."""
    from tuneforge.train import fused_loss

    head = fused_loss.head_of(model)
    if head is None:
        logits = model(input_ids=batch.ids, attention_mask=batch.attention).logits[:, :-1].float()
        return -F.cross_entropy(logits.transpose(1, 2), batch.targets, reduction="none") * batch.targets_mask
    chosen = batch.targets_mask.bool()
    hidden = _shared_prompts(model, batch, shared) if shared is not None and shared.group > 1 else None
    if hidden is None:
        with fused_loss.hidden_states_instead_of_logits(model) as captured:
            model(input_ids=batch.ids, attention_mask=batch.attention)
        hidden = captured[0][:, :-1][chosen]
    logits, _ = fused_loss.final_logits(hidden, head)
    logps = torch.zeros(batch.targets.shape, dtype=logits.dtype, device=logits.device)
    return logps.masked_scatter(chosen, -F.cross_entropy(logits, batch.targets[chosen], reduction="none"))


def _shared_prompts(model: Any, batch: _Batch, shared: _Shared) -> torch.Tensor | None:
    """The final hidden states that predict each completion token, in the order of the batch's
    completion positions, with each group's prompt computed once: its forward pass (gradients
    kept) fills a cache whose keys and values are repeated for its `group` rows, and the
    completions run on it with their own positions. About half of every row is the prompt, so
    this drops (group - 1) / group of those tokens from the forward and backward passes; the
    result is the full pass's up to float rounding. None where it does not apply (rows not in
    groups of one prompt, gradient checkpointing, a cache that cannot be repeated): the caller
    runs the full pass."""
    from tuneforge.train import fused_loss
    from tuneforge.train.distributed import unwrap

    chunk, group, pad_id = shared.chunk, shared.group, shared.pad_id
    groups = [chunk[start:start + group] for start in range(0, len(chunk), group)]
    if len(chunk) % group or any(row.prompt_ids != rows[0].prompt_ids for rows in groups for row in rows) \
            or getattr(unwrap(model), "is_gradient_checkpointing", False):
        return None
    device = batch.ids.device
    width = max(len(rows[0].prompt_ids) for rows in groups)
    prompt_ids = torch.full((len(groups), width), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((len(groups), width), dtype=torch.long)
    for index, rows in enumerate(groups):  # left-padded, as the sampler's: a completion follows its prompt
        prompt_ids[index, width - len(rows[0].prompt_ids):] = torch.tensor(rows[0].prompt_ids)  # in the cache
        prompt_mask[index, width - len(rows[0].prompt_ids):] = 1  # (sliding windows count cache slots)
    prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)
    with fused_loss.hidden_states_instead_of_logits(model) as captured:
        output = model(input_ids=prompt_ids, attention_mask=prompt_mask, use_cache=True,
                       position_ids=(prompt_mask.cumsum(dim=1) - 1).clamp(min=0))
    cache = getattr(output, "past_key_values", None)
    if cache is None or not hasattr(cache, "batch_repeat_interleave"):
        return None
    cache.batch_repeat_interleave(group)
    lengths = torch.tensor([len(row.prompt_ids) for row in chunk], device=device)
    longest = max(len(row.completion_ids) for row in chunk)
    fed = max(1, longest - 1)  # the last completion token predicts nothing
    ids = torch.full((len(chunk), fed), pad_id, dtype=torch.long)
    mask = torch.zeros((len(chunk), fed), dtype=torch.long)
    for row, rollout in enumerate(chunk):
        tokens = rollout.completion_ids[:fed]
        ids[row, :len(tokens)] = torch.tensor(tokens)
        mask[row, :len(tokens)] = 1
    ids, mask = ids.to(device), mask.to(device)
    positions = lengths.unsqueeze(1) + torch.arange(fed, device=device).unsqueeze(0)
    with fused_loss.hidden_states_instead_of_logits(model) as completed:
        model(input_ids=ids, attention_mask=torch.cat([prompt_mask.repeat_interleave(group, dim=0), mask], dim=1),
              position_ids=positions, past_key_values=cache, use_cache=True)
    last = captured[0][:, -1]
    hidden = torch.cat([last.repeat_interleave(group, dim=0).unsqueeze(1), completed[0]], dim=1)
    counts = torch.tensor([len(row.completion_ids) for row in chunk], device=device)
    return hidden[torch.arange(hidden.shape[1], device=device).unsqueeze(0) < counts.unsqueeze(1)]


def _k3(model: Any, batch: _Batch, logps: torch.Tensor, shared: _Shared | None = None) -> torch.Tensor:
    """exp(ref - p) - (ref - p) - 1 per token, ref from the base model (the adapter turned off)."""
    disable = getattr(model, "disable_adapter", None)
    if disable is None:
        raise UserInputError("unsupported_kl", "kl_coef needs a LoRA job: the base model is the adapter turned off",
                             param="method.reinforcement.hyperparameters.kl_coef")
    with torch.no_grad(), disable():
        reference = _token_logps(model, batch, shared)
    delta = reference - logps
    return torch.exp(delta) - delta - 1


def _prompt_ids(tokenizer: Any, record: dict[str, Any]) -> list[int]:
    messages = [{"role": message["role"], "content": message.get("content") or ""}
                for message in record["messages"]]
    tools = record.get("tools")
    extra = {"tools": tools} if tools else {}
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **extra)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _eos_ids(tokenizer: Any) -> set[int]:
    ids = {int(tokenizer.eos_token_id)} if tokenizer.eos_token_id is not None else set()
    for token in ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>"):
        found = tokenizer.convert_tokens_to_ids(token) if token in tokenizer.get_vocab() else None
        if isinstance(found, int):
            ids.add(found)
    if not ids:
        raise UserInputError("unsupported_tokenizer", "the base model's tokenizer has no end-of-sequence token: "
                             "completions could not end", param="model")
    return ids


def default_tools(spec: Any, grader: Any) -> score.GradingTools:
    """What the grader uses in the trainer: the sandbox (python graders), the judges its model graders
    name, asked through the control plane (train/judges.py), and the operator's embeddings endpoint
    fetched from the control plane with the job token (cosine)."""
    from functools import partial

    python = judge = embeddings = None
    if has_type(grader, "python"):
        from tuneforge.graders import sandbox

        if sandbox.available(spec.grader_python) is not None:
            raise RuntimeError("python graders need the sandbox (bubblewrap) on the trainer's host")
        limits = replace(sandbox.SandboxLimits(), wall_time_s=spec.grader_timeout_s)
        python = partial(sandbox.PythonSandbox, python=spec.grader_python, limits=limits)
    if has_type(grader, "score_model") or has_type(grader, "label_model"):
        from tuneforge.train.judges import ControlPlaneJudge

        judge = ControlPlaneJudge(spec, grader)
    if uses_cosine(grader):
        from tuneforge.train import credentials

        embeddings = embeddings_for(spec.grader_embeddings, credentials.fetch(spec).endpoints)
    return score.GradingTools(python=python, judge=judge, embeddings=embeddings)


def _vllm_rollouts(run: Any, options: ReinforcementOptions) -> Any:
    """The attempt's vLLM rollouts where they apply (train/vllm_rollouts.py), else None (logged)."""
    from tuneforge.train import vllm_rollouts

    why = vllm_rollouts.unavailable(run.spec, run.device, world_size=run.dist.world,
                                    response_format=options.response_format is not None)
    if why is not None:
        if run.spec.rollout_vllm_memory > 0:
            log.info("rollouts are sampled by the trainer, not vLLM: %s", why)
        return None
    import tempfile
    from pathlib import Path

    from tuneforge.storage.model_cache import fetch_base_model

    base_dir = fetch_base_model(run.store, run.spec.base_model, Path(run.spec.cache_dir) if run.spec.cache_dir
                                else None)
    return vllm_rollouts.VllmRollouts(run.spec, base_dir, Path(tempfile.mkdtemp(prefix="tuneforge-rollouts-")),
                                      lora_rank=run.spec.lora.rank,
                                      max_model_len=run.spec.hyperparameters.max_seq_length)


def build(options: ReinforcementOptions) -> ReinforcementObjective:
    return ReinforcementObjective(options)
