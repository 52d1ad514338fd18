"""Executors carry out the scheduler's decisions: `local` (subprocesses on this
host) and `ray` (attempts on a Ray cluster)."""

from tuneforge.executors.protocol import Capacity, Executor, NodeCapacity, Placement, PollResult

__all__ = ["Capacity", "Executor", "NodeCapacity", "Placement", "PollResult", "make_executor"]


def make_executor(settings):  # noqa: ANN001, ANN201
    if settings.executor == "local":
        from tuneforge.executors.local import LocalExecutor

        return LocalExecutor(settings)
    if settings.executor == "ray":
        from tuneforge.executors.ray import RayExecutor

        return RayExecutor(settings)
    raise ValueError(f"unknown executor {settings.executor!r} (TUNEFORGE_EXECUTOR); available: local, ray")
