"""Ways an attempt ends early, each mapped to an exit code by `train.runner`."""

from __future__ import annotations

from tuneforge.modeling.errors import UnsupportedJob, UserInputError

__all__ = ["AttemptFenced", "ReportRefused", "TrainingDiverged", "UnsupportedJob", "UserInputError"]


class TrainingDiverged(Exception):
    """The loss stopped being finite or stayed far above its best: a user error
    (code `training_diverged`); retrying the same job would diverge again."""

    code = "training_diverged"

    def __init__(self, step: int, what: str, *, learning_rate: float | None = None) -> None:
        self.step = step
        advice = ("Try a lower learning_rate_multiplier (half of it is a good first step), a larger batch_size, "
                  "a lower max_grad_norm, or more warmup (warmup_ratio); check the training data for very long "
                  "or garbled examples.")
        lr = f" (learning rate {learning_rate:.3g})" if learning_rate is not None else ""
        super().__init__(f"training diverged at step {step}{lr}: {what}. {advice}")


class AttemptFenced(Exception):
    """The control plane no longer accepts this attempt; it must stop and write nothing."""


class ReportRefused(Exception):
    """A report of this attempt was refused for what it holds: by its own type before it was
    queued (`status` None), or by the control plane (`status` its 4xx, the message its reason).
    Deterministic, so the attempt ends once (`report_refused`) rather than retrying."""

    code = "report_refused"

    def __init__(self, kind: str, reason: str, *, status: int | None = None) -> None:
        where = "the trainer's check" if status is None else f"the control plane (HTTP {status})"
        super().__init__(f"the {kind} report was refused by {where}: {reason}")
        self.kind = kind
        self.reason = reason
        self.status = status
