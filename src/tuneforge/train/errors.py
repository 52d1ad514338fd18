"""Ways an attempt ends early, each mapped to an exit code by `train.runner`."""

from __future__ import annotations


class TrainingDiverged(Exception):
    """The loss or the gradient norm stopped being finite: a user error (code `divergence`)."""

    code = "divergence"

    def __init__(self, step: int, what: str) -> None:
        self.step = step
        super().__init__(f"training diverged at step {step}: {what} is not finite")


class AttemptFenced(Exception):
    """The control plane no longer accepts this attempt; it must stop and write nothing."""


class UnsupportedJob(Exception):
    """The spec asks for a method or training type this trainer does not run."""

    code = "unsupported_method"
