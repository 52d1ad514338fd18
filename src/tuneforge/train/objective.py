"""What a training method plugs into the one loop (`train/loop.py`): an `Objective`.

The loop owns order, steps, accumulation, checkpoints, resume, preemption,
eval and artifacts; an objective owns what is trained on and how one forward
pass is scored. Methods share functions (this module's `token_scores`,
`train/pairs.py`), never base classes.

Units: the loss of a step is `sum(loss_sum) / units(step's examples)`, so
every unit weighs the same however the step is split into micro-batches —
target tokens for token-level objectives, examples (pairs, completions) for
preference objectives.

Rollouts: an objective that generates before it scores (reinforcement
methods) also has `prepare_step(examples, context) -> examples` (the
`PreparesSteps` protocol): the loop calls it once per optimizer step, before
`units` and `chunks`, and scores what it returns. `context` (`StepContext`)
holds the model in eval mode without gradients for the duration of the call
and a generator seeded from the job's seed and the step, so that a resumed run
samples what an uninterrupted one would. An objective without it is scored on
the step's examples as they are.

Figures of its own: `Scores.metrics` holds sums over the micro-batch's
`count`, like `loss_sum`; the step reports each summed over its micro-batches
and divided by the step's count, and the figure reaches the metrics event,
the checkpoint's metrics, the results file and the console by its name
(`domain/metrics.py` says which names are the loop's own).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from tuneforge.domain.spec import DataFileRef, Hyperparameters

if TYPE_CHECKING:  # torch and the batch helpers load with the trainer, never with the control plane
    import torch

    from tuneforge.data.tokenize import TokenizedExample
    from tuneforge.storage.store import ObjectStore
    from tuneforge.train.batches import MicroBatch
    from tuneforge.train.run import Run


@dataclass(frozen=True)
class Scores:
    """One forward pass: the objective's loss summed over its units (keeps the graph),
    hits and units for the accuracy, real and computed token positions."""

    loss_sum: torch.Tensor
    correct: int
    count: int
    num_tokens: int
    num_slots: int
    metrics: Mapping[str, float] = field(default_factory=dict)  # the objective's own, summed over `count`


@dataclass(frozen=True)
class StepContext:
    """What `prepare_step` may use. The model is in eval mode and gradients are off while the
    hook runs; the loop switches it back to training after. Sampling must draw from `generator`
    (not the global RNG): its seed derives from the job's seed and `step`, so an attempt that
    resumed at this step draws the same numbers."""

    model: Any
    tokenizer: Any
    generator: torch.Generator
    step: int  # the optimizer step being prepared, 1-based (validating: the last step done)
    device: torch.device
    hyperparameters: Hyperparameters
    validation: bool = False  # preparing the validation set rather than a training step


class Objective(Protocol):
    name: str

    def load(self, store: ObjectStore, ref: DataFileRef, tokenizer: Any, hp: Hyperparameters, *, label: str,
             base_model_sha256: str) -> Sequence[Any]:
        """Every example of a prepared file, ready for `chunks` (`label`: "training" or "validation"):
        a list, or for the token objectives shards on disk read an example at a time."""

    def prepare(self, run: Run) -> None:
        """Before the first step of an attempt (e.g. reference log-probabilities)."""

    def units(self, examples: list[Any]) -> int:
        """What the step's loss is averaged over."""

    def chunks(self, examples: list[Any], hp: Hyperparameters) -> list[list[Any]]:
        """The forward passes (micro-batches) of a step's examples."""

    def forward(self, run: Run, chunk: list[Any]) -> Scores:
        """Score one micro-batch."""


class PreparesSteps(Protocol):
    """The optional rollout phase of an `Objective` (see the module's docstring)."""

    def prepare_step(self, examples: list[Any], context: StepContext) -> list[Any]:
        """What the step scores instead of `examples` (e.g. the prompts with sampled completions)."""


# -- shared by the token-level objectives (supervised, continued pre-training) ---


@dataclass(frozen=True)
class TokenObjective:
    """Next-token cross-entropy on the target tokens of tokenized examples; `loader` reads a
    prepared file into them (supervised: chat template and loss masks; cpt: plain text)."""

    name: str
    loader: Callable[..., Sequence[Any]]  # (store, ref, tokenizer, hp, *, label, base_model_sha256)

    def load(self, store: ObjectStore, ref: DataFileRef, tokenizer: Any, hp: Hyperparameters, *, label: str,
             base_model_sha256: str) -> Sequence[Any]:
        return self.loader(store, ref, tokenizer, hp, label=label, base_model_sha256=base_model_sha256)

    def prepare(self, run: Run) -> None:
        return None

    def units(self, examples: list[Any]) -> int:
        return token_units(examples)

    def chunks(self, examples: list[Any], hp: Hyperparameters) -> list[list[Any]]:
        return token_chunks(examples, hp)

    def forward(self, run: Run, chunk: list[Any]) -> Scores:
        return token_scores(run, chunk)


def load_token_examples(store: ObjectStore, ref: DataFileRef, tokenizer: Any, hp: Hyperparameters, *, label: str,
                        base_model_sha256: str) -> Sequence[TokenizedExample]:
    from tuneforge.train.batches import load_tokenized

    return load_tokenized(store, ref, tokenizer, hp, label=label, base_model_sha256=base_model_sha256)


def token_units(examples: list[TokenizedExample]) -> int:
    from tuneforge.train.batches import target_token_count

    return sum(target_token_count(example) for example in examples)


def token_chunks(examples: list[TokenizedExample], hp: Hyperparameters) -> list[list[Any]]:
    from tuneforge.train.batches import step_micro_batches

    return step_micro_batches(examples, hp)


def token_scores(run: Run, chunk: list[list[TokenizedExample]]) -> Scores:
    """Next-token cross-entropy over the target tokens of packed rows (or one example per row)."""
    from tuneforge.train.batches import score_tokens

    batch = make_batch(run, chunk)
    scores = score_tokens(run.model, batch, fused=run.fused_loss)
    return Scores(scores.loss_sum, scores.correct, scores.count, batch.num_tokens, batch.num_slots)


def make_batch(run: Run, rows: list[list[TokenizedExample]]) -> MicroBatch:
    """Tensors for one forward pass: packed rows, or one example per row."""
    from tuneforge.train.batches import collate, collate_packed, packed_mask_options

    if run.spec.hyperparameters.packing:
        options = packed_mask_options(run.model)
        if options == {"block_mask": False}:
            # variable-length attention: the micro-batch's rows as one, so that nothing is padding
            rows = [[example for row in rows for example in row]]
        return collate_packed(rows, run.tokenizer.pad_token_id, run.device, **options)
    return collate([row[0] for row in rows], run.tokenizer.pad_token_id, run.device)
