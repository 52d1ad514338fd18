"""Exit codes of `python -m tuneforge.train`: how an attempt ended."""

from __future__ import annotations

from enum import IntEnum


class TrainerExit(IntEnum):
    SUCCESS = 0
    USER_ERROR = 10  # bad data, divergence: the job fails, retrying will not help
    PLATFORM_ERROR = 11  # our fault or the machine's: the attempt may be retried
    PREEMPTED = 12  # SIGTERM honoured: checkpoint written, job goes back to the queue
    OUT_OF_MEMORY = 13  # retry with a smaller micro-batch
    FENCED = 14  # the control plane says this attempt is no longer current
    # a report was refused by its type (here or in the control plane): the job fails, not retried
    REPORT_REFUSED = 15


def describe(code: int | None) -> str:
    if code is None:
        return "still running"
    try:
        return TrainerExit(code).name.lower()
    except ValueError:
        if code < 0:
            return f"killed by signal {-code}"
        return f"exit code {code}"
