"""Points where tests and the chaos benchmark reach into a running attempt.

The loop calls these hooks and knows nothing of what they do; production
runs with `NO_HOOKS`. A test running the trainer in its own process passes
its faults in the spec's `extra` (`faults_from_extra`, the only reader of
those keys):

  stop_after_step: int — after that optimizer step, stop as on SIGTERM
                   (checkpoint, exit `PREEMPTED`).
  preempt_during_step: int — SIGTERM arrives after the first micro-batch
                   of that step.
  simulate_oom_above_micro_batch: int — a micro-batch larger than this
                   raises an out-of-memory error, as CUDA would.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from tuneforge.train.run import Run


class Hooks(Protocol):
    def stop_reason(self, run: Run) -> str | None:
        """Before a step: a reason to stop the attempt as if preempted, or None."""

    def before_micro_batch(self, run: Run, index: int) -> None:
        """Before the forward pass of a step's `index`-th micro-batch (may raise)."""

    def after_micro_batch(self, run: Run, index: int) -> None:
        """After the backward pass of a step's `index`-th micro-batch."""


class NoHooks:
    def stop_reason(self, run: Run) -> str | None:
        return None

    def before_micro_batch(self, run: Run, index: int) -> None:
        return None

    def after_micro_batch(self, run: Run, index: int) -> None:
        return None


NO_HOOKS = NoHooks()


@dataclass(frozen=True)
class Faults:
    """Injected faults (see the module's docstring); None: that fault is off."""

    stop_after_step: int | None = None
    preempt_during_step: int | None = None
    simulate_oom_above_micro_batch: int | None = None

    def stop_reason(self, run: Run) -> str | None:
        if self.stop_after_step is not None and run.state.step >= self.stop_after_step:
            return "stop_after_step"
        return None

    def before_micro_batch(self, run: Run, index: int) -> None:
        limit = self.simulate_oom_above_micro_batch
        micro = run.spec.hyperparameters.micro_batch_size
        if limit is not None and micro > limit:
            import torch

            raise torch.OutOfMemoryError(f"simulated: a micro-batch of {micro} does not fit (limit {limit})")

    def after_micro_batch(self, run: Run, index: int) -> None:
        if self.preempt_during_step == run.state.step + 1 and index == 0:
            run.stop.requested_at = time.monotonic()  # type: ignore[attr-defined] - as the SIGTERM handler does
            run.stop.set()


def faults_from_extra(extra: Mapping[str, Any]) -> Hooks:
    """The faults a spec's `extra` asks for, or `NO_HOOKS`."""
    values = {name: int(extra[name]) for name in Faults.__dataclass_fields__ if extra.get(name) is not None}
    return Faults(**values) if values else NO_HOOKS
