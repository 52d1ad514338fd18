"""Asynchronous successive halving (ASHA) as early stopping: pure functions.

Rungs are points of training a trial passes: after `min_epochs`, then `eta` times as many
epochs, and so on, below the trials' full length. When a trial reaches a rung (a checkpoint at
or past that epoch, with the objective measured there), its value joins the rung's record; the
trial goes on only if it is among the best 1/eta of all values recorded at that rung so far
(itself included), else it is stopped. Nothing waits for other trials: a trial that reaches a
rung first always goes on, and later ones are judged against those before them. Stopped trials
free their GPUs at once; the best trial by its final objective wins the sweep.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Asha:
    min_epochs: float = 1.0
    eta: int = 3
    minimize: bool = True

    def rungs(self, max_epochs: float) -> list[float]:
        """Epochs at which trials are judged (below the full length: a finished trial is not stopped)."""
        out, epochs = [], self.min_epochs
        while epochs < max_epochs - 1e-9:
            out.append(epochs)
            epochs *= self.eta
        return out

    def keeps(self, value: float, recorded: Sequence[float]) -> bool:
        """Whether a trial with `value` at a rung where `recorded` (its own value included) were
        measured goes on: it is among the best ceil(n / eta)."""
        ordered = sorted(recorded, reverse=not self.minimize)
        kept = max(1, math.ceil(len(ordered) / self.eta))
        cutoff = ordered[kept - 1]
        return value <= cutoff if self.minimize else value >= cutoff


def reached(points: Sequence[tuple[float, float]], rung: float) -> float | None:
    """The objective a trial had at `rung` epochs: its first measurement at or past it (points:
    (epoch, value) in training order); None when it has not got there."""
    for epoch, value in points:
        if epoch >= rung - 1e-9:
            return value
    return None


def judge(asha: Asha, max_epochs: float, points: Sequence[tuple[float, float]], judged: int,
          records: Mapping[int, Sequence[float]]) -> tuple[list[tuple[int, float]], bool]:
    """Rungs a trial passed since it was last judged (`judged` rungs so far): the (rung index,
    value) pairs to record, and whether it goes on. `records`: values recorded at each rung so
    far by other trials."""
    new: list[tuple[int, float]] = []
    for index, rung in enumerate(asha.rungs(max_epochs)):
        if index < judged:
            continue
        value = reached(points, rung)
        if value is None:
            break
        new.append((index, value))
        if not asha.keeps(value, [*records.get(index, ()), value]):
            return new, False
    return new, True
