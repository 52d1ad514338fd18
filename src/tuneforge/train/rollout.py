"""The rollout phase of a step: an objective that generates before it scores.

An objective with `prepare_step` (train/objective.py, `PreparesSteps`) is
handed the examples of a step (or the validation set) and returns what is
scored instead, typically the prompts with completions it sampled from the
current model. Around the call the model is in eval mode (no dropout) with
gradients off, and it goes back to the mode it was in after, whatever
happens. Under FSDP every rank prepares the whole step: generating runs
forward passes, which the ranks of a sharded model take part in together,
and the same generator on every rank samples the same completions.

Determinism: sampling draws from a generator of its own, seeded from the
job's seed, the step and the stream (training or validation) — never from
the global RNG, whose state the checkpoint restores but which dropout also
draws from. So the numbers a step samples depend on nothing but which step it
is, and a resumed attempt samples what an uninterrupted one did.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from tuneforge.train import distributed
from tuneforge.train.objective import StepContext
from tuneforge.train.run import Run


def step_generator(seed: int, step: int, device: torch.device, *, validation: bool = False) -> torch.Generator:
    """A generator on `device` whose seed is a hash of (seed, training or validation, step):
    neighbouring steps and jobs with neighbouring seeds draw unrelated numbers."""
    stream = "validation" if validation else "training"
    digest = hashlib.sha256(f"{seed}:{stream}:{step}".encode()).digest()
    generator = torch.Generator(device=device)
    generator.manual_seed(int.from_bytes(digest[:8], "big") >> 1)  # (manual_seed takes 63 bits)
    return generator


def prepare(run: Run, examples: list[Any], *, validation: bool = False) -> list[Any]:
    """What the next step (or the validation after the last one) scores: `examples` as they are,
    or what the objective's `prepare_step` made of them."""
    hook = getattr(run.objective, "prepare_step", None)
    if hook is None:
        return examples
    step = run.state.step if validation else run.state.step + 1
    model = distributed.unwrap(run.model)  # generation calls the model itself, never a DDP wrapper
    context = StepContext(model=model, tokenizer=run.tokenizer, step=step, device=run.device,
                          generator=step_generator(run.spec.seed, step, run.device, validation=validation),
                          hyperparameters=run.spec.hyperparameters, validation=validation)
    was_training = run.model.training
    run.model.eval()
    try:
        with torch.no_grad():
            return list(hook(examples, context))
    finally:
        run.model.train(was_training)
        run.dist.reshard(run.model)  # (a forward without gradients leaves a sharded model gathered)
