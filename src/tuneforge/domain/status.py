"""Job statuses and the allowed transitions between them.

The table is pure data; `tuneforge.services.training.transitions` is the one module
that writes a job's status and checks every change against it.
"""

from __future__ import annotations

from enum import Enum


class JobStatus(str, Enum):
    VALIDATING_FILES = "validating_files"
    QUEUED = "queued"
    RUNNING = "running"
    EVALUATING = "evaluating"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    PAUSED = "paused"


TERMINAL = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED})

ALLOWED: dict[JobStatus, frozenset[JobStatus]] = {
    JobStatus.VALIDATING_FILES: frozenset(
        {JobStatus.QUEUED, JobStatus.FAILED, JobStatus.CANCELLED}
    ),
    JobStatus.QUEUED: frozenset(
        {JobStatus.RUNNING, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.PAUSED}
    ),
    # running -> queued is a restart (preempted or lost attempt), not a failure
    JobStatus.RUNNING: frozenset(
        {
            JobStatus.QUEUED,
            JobStatus.EVALUATING,
            JobStatus.SUCCEEDED,
            JobStatus.FAILED,
            JobStatus.CANCELLED,
            JobStatus.PAUSED,
        }
    ),
    # evaluating -> queued: the attempt was preempted or lost during the eval; it resumes from the
    # checkpoint of the last step and evaluates again
    JobStatus.EVALUATING: frozenset(
        {JobStatus.QUEUED, JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.PAUSED}
    ),
    JobStatus.PAUSED: frozenset({JobStatus.QUEUED, JobStatus.CANCELLED}),
    JobStatus.SUCCEEDED: frozenset(),
    JobStatus.FAILED: frozenset(),
    JobStatus.CANCELLED: frozenset(),
}


def can_transition(current: JobStatus, target: JobStatus) -> bool:
    return target in ALLOWED[current]


class AttemptStatus(str, Enum):
    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    PREEMPTED = "preempted"
    LOST = "lost"
    CANCELLED = "cancelled"


ATTEMPT_ACTIVE = frozenset({AttemptStatus.STARTING, AttemptStatus.RUNNING})
