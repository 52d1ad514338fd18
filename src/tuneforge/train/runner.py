"""One attempt from spec to exit code: looks the method up, runs the loop, turns failures into reports.

The mapping to `TrainerExit` lives here and only here:

    bad data (BadDataError)       → `failure` report with code and line → USER_ERROR
    divergence                    → `failure` report `divergence`        → USER_ERROR
    unsupported method            → `failure` report                      → USER_ERROR
    fenced by the control plane   → nothing more is sent                  → FENCED
    out of memory                 → error event                           → OUT_OF_MEMORY
    anything else                 → error event                           → PLATFORM_ERROR
"""

from __future__ import annotations

import logging
import threading
import traceback

import torch

from tuneforge.data.errors import BadDataError
from tuneforge.domain.exit_codes import TrainerExit
from tuneforge.domain.spec import JobSpec
from tuneforge.storage.store import ObjectStore
from tuneforge.train import methods
from tuneforge.train.errors import AttemptFenced, TrainingDiverged, UnsupportedJob
from tuneforge.train.hooks import Hooks, faults_from_extra
from tuneforge.train.reporter import Reporter, message_event

log = logging.getLogger(__name__)

TRAINING_TYPES = ("lora", "qlora", "full")


def run_attempt(
    spec: JobSpec, store: ObjectStore, reporter: Reporter, stop: threading.Event | None = None,
    hooks: Hooks | None = None,
) -> TrainerExit:
    """`hooks`: what tests inject (`train/hooks.py`); by default the faults the spec's `extra` asks for."""
    stop = stop or threading.Event()
    try:
        if spec.method not in methods.names() or spec.training_type not in TRAINING_TYPES:
            raise UnsupportedJob(
                f"this trainer runs methods {', '.join(methods.names())} with training types "
                f"{', '.join(TRAINING_TYPES)}; got {spec.method!r} / {spec.training_type!r}"
            )
        from tuneforge.train.loop import run_training

        method = methods.get(spec.method)
        objective = method.objective({**method.option_defaults, **spec.hyperparameters.method_options})
        return run_training(spec, store, reporter, stop, objective,
                            hooks if hooks is not None else faults_from_extra(spec.extra))
    except AttemptFenced as exc:
        log.error("%s", exc)
        return TrainerExit.FENCED
    except BadDataError as exc:
        log.error("bad data: %s", exc)
        _fail(reporter, exc.code, str(exc))
        return TrainerExit.USER_ERROR
    except (TrainingDiverged, UnsupportedJob) as exc:
        log.error("%s", exc)
        _fail(reporter, exc.code, str(exc))
        return TrainerExit.USER_ERROR
    except (torch.OutOfMemoryError, MemoryError) as exc:
        log.error("out of memory: %s", exc)
        _error_event(reporter, f"out of memory: {exc}")
        return TrainerExit.OUT_OF_MEMORY
    except Exception as exc:  # the attempt must always end with a code the scheduler understands
        log.exception("platform error")
        _error_event(reporter, f"trainer error: {type(exc).__name__}: {exc}", traceback.format_exc())
        return TrainerExit.PLATFORM_ERROR


def _fail(reporter: Reporter, code: str, message: str) -> None:
    if not reporter.fenced:
        reporter.report("failure", {"code": code, "message": message})


def _error_event(reporter: Reporter, message: str, details: str = "") -> None:
    if not reporter.fenced:
        data = {"traceback": details[-4000:]} if details else {}
        reporter.report("events", message_event(message, level="error", data=data))
