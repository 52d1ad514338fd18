"""A training method that generates before it scores, for tests of the loop's rollout seam.

`RolloutObjective` reads supervised examples, and in `prepare_step` samples a
few tokens after the prompt of each (its tokens before the first target
token) from the current model (seeded
sampling from the step's generator; a token that leaves 3 divided by 5 ends a completion
early, so that lengths vary). It scores the sampled completions by their
mean negative log-likelihood and reports two figures of its own:
`rollout_mean_length` (tokens sampled per completion) and `reward_mean` (the
share of even tokens in a completion). It records how each hook call found
the model. `registered` puts it in the method registry as "rollout" for the
duration of a test.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from tuneforge import methods
from tuneforge.domain.job_config import SupervisedHyperparameters
from tuneforge.domain.spec import Hyperparameters
from tuneforge.train.objective import Scores, StepContext, load_token_examples

MAX_NEW_TOKENS = 5


@dataclass(frozen=True)
class Rollout:
    prompt_ids: list[int]
    completion_ids: list[int]


@dataclass(frozen=True)
class HookCall:
    """How one `prepare_step` call found things."""

    step: int
    validation: bool
    examples: int
    model_training: bool
    grad_enabled: bool
    lengths: tuple[int, ...]  # tokens sampled for each example


@dataclass
class RolloutObjective:
    name: str = "rollout"
    calls: list[HookCall] = field(default_factory=list)
    forward_training: list[bool] = field(default_factory=list)  # model.training at each training forward

    def load(self, store: Any, ref: Any, tokenizer: Any, hp: Hyperparameters, *, label: str,
             base_model_sha256: str) -> list[Any]:
        return load_token_examples(store, ref, tokenizer, hp, label=label, base_model_sha256=base_model_sha256)

    def prepare(self, run: Any) -> None:
        return None

    def prepare_step(self, examples: list[Any], context: StepContext) -> list[Rollout]:
        prompts = [example.input_ids[:first_target(example.labels)] for example in examples]
        rollouts = [Rollout(prompt, sample(context, prompt)) for prompt in prompts]
        self.calls.append(HookCall(context.step, context.validation, len(examples), context.model.training,
                                   torch.is_grad_enabled(), tuple(len(r.completion_ids) for r in rollouts)))
        return rollouts

    def units(self, examples: list[Rollout]) -> int:
        return len(examples)

    def chunks(self, examples: list[Rollout], hp: Hyperparameters) -> list[list[Rollout]]:
        size = hp.micro_batch_size
        return [examples[start:start + size] for start in range(0, len(examples), size)]

    def forward(self, run: Any, chunk: list[Rollout]) -> Scores:
        if torch.is_grad_enabled():
            self.forward_training.append(run.model.training)
        return score(run, chunk)


def first_target(labels: list[int]) -> int:
    return next(index for index, label in enumerate(labels) if label != -100)


def sample(context: StepContext, prompt_ids: list[int]) -> list[int]:
    """Up to `MAX_NEW_TOKENS` tokens drawn from the model's next-token distribution."""
    ids = torch.tensor([prompt_ids], device=context.device)
    completion: list[int] = []
    for _ in range(MAX_NEW_TOKENS):
        probabilities = torch.softmax(context.model(input_ids=ids).logits[0, -1].float(), dim=-1)
        token = int(torch.multinomial(probabilities, 1, generator=context.generator))
        completion.append(token)
        ids = torch.cat([ids, torch.tensor([[token]], device=context.device)], dim=1)
        if token % 5 == 3:  # a stand-in for an end-of-sequence token
            break
    return completion


def score(run: Any, chunk: list[Rollout]) -> Scores:
    """Mean negative log-likelihood of each completion, summed over the chunk's completions."""
    width = max(len(r.prompt_ids) + len(r.completion_ids) for r in chunk)
    pad = run.tokenizer.pad_token_id
    ids = torch.full((len(chunk), width), pad, dtype=torch.long)
    labels = torch.full((len(chunk), width), -100, dtype=torch.long)
    mask = torch.zeros((len(chunk), width), dtype=torch.long)
    for row, rollout in enumerate(chunk):
        sequence = rollout.prompt_ids + rollout.completion_ids
        ids[row, :len(sequence)] = torch.tensor(sequence)
        labels[row, len(rollout.prompt_ids):len(sequence)] = torch.tensor(rollout.completion_ids)
        mask[row, :len(sequence)] = 1
    ids, labels, mask = ids.to(run.device), labels.to(run.device), mask.to(run.device)
    logits = run.model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
    targets = labels[:, 1:]
    losses = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none", ignore_index=-100)
    lengths = (targets != -100).sum(dim=1)
    loss_sum = (losses.sum(dim=1) / lengths.clamp(min=1)).sum()
    rewards = [sum(token % 2 == 0 for token in r.completion_ids) / len(r.completion_ids) for r in chunk]
    return Scores(loss_sum, correct=0, count=len(chunk), num_tokens=int(mask.sum()), num_slots=mask.numel(),
                  metrics={"rollout_mean_length": float(lengths.sum()), "reward_mean": float(sum(rewards))})


_built: list[list[RolloutObjective]] = [[]]  # the objectives `build` made in the current block


def build(options: Any) -> RolloutObjective:
    """The catalogue's dotted path names this: the trainer calls it with the (empty) options."""
    _built[-1].append(RolloutObjective())
    return _built[-1][-1]


@contextmanager
def registered() -> Iterator[list[RolloutObjective]]:
    """"rollout" in the method registry while the block runs; yields the objectives it builds,
    one per attempt."""
    built: list[RolloutObjective] = []
    _built.append(built)
    method = methods.TrainingMethod(
        name="rollout", summary="samples completions, then scores them (tests only)",
        hyperparameters=SupervisedHyperparameters, data_kinds=("chat",),
        learning_rate={"lora": 1e-2, "qlora": 1e-2, "full": 1e-4},
        objective="tests.helpers.rollout_objective:build",
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(methods._load(), "rollout", method)
        try:
            yield built
        finally:
            _built.remove(built)
