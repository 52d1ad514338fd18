"""One attempt from spec to exit code: looks the method up, runs the loop, turns failures into reports.

Every failure is classified here and only here, and reported once as a
`failure` report (`domain/reports.Failure`) with a stable code, a message for
the tenant and a correlation id; the traceback goes to this process's log
(the attempt log the operator reads) under the same id:

    failure                                   classification  code                   exit
    bad data (BadDataError)                   user            the data check's code  USER_ERROR
    tenant input the trainer cannot use       user            UserInputError.code    USER_ERROR
      (LoRA target modules, eval config, ...)
    unsupported method or training type       user            unsupported_method     USER_ERROR
    divergence                                user            training_diverged      USER_ERROR
    out of memory                             out_of_memory   out_of_memory          OUT_OF_MEMORY
    fenced by the control plane               (nothing sent)                         FENCED
    a report refused by its type or the       report_refused  report_refused         REPORT_REFUSED
      control plane (a 4xx but 401/409)
    anything else                             platform        platform_error         PLATFORM_ERROR

A refused report is deterministic: sent again it would be refused again. So it
ends the attempt once, and the job fails without a retry (billed like a user
error: `services/tenancy/usage.py`); the message names the report and the reason, and
the control plane logged the same refusal under its own error id.
"""

from __future__ import annotations

import logging
import sys
import threading

import torch

from tuneforge import methods
from tuneforge.data.errors import BadDataError
from tuneforge.domain.exit_codes import TrainerExit
from tuneforge.domain.ids import correlation_id
from tuneforge.domain.spec import POOL_METHOD, JobSpec
from tuneforge.domain.vocab import TRAINING_TYPES
from tuneforge.storage.store import ObjectStore
from tuneforge.train import objectives
from tuneforge.train.errors import AttemptFenced, ReportRefused, TrainingDiverged, UnsupportedJob, UserInputError
from tuneforge.train.hooks import Hooks, faults_from_extra
from tuneforge.train.reporter import Reporter

log = logging.getLogger(__name__)

PLATFORM_MESSAGE = ("The trainer stopped on an internal error; this is not a problem with your data or "
                    "configuration, and the attempt is retried from the last checkpoint")
REFUSED_MESSAGE = ("The trainer's {kind} report was refused {by}: {reason}. The attempt ends without a retry, "
                   "since the same report would be refused again; the operator's log has the details under "
                   "the error id")
OOM_MESSAGE = ("The training step ran out of memory; the attempt is retried with a smaller micro-batch "
               "(same batch size)")


def run_attempt(
    spec: JobSpec, store: ObjectStore, reporter: Reporter, stop: threading.Event | None = None,
    hooks: Hooks | None = None,
) -> TrainerExit:
    """`hooks`: what tests inject (`train/hooks.py`); by default the faults the spec's `extra` asks for."""
    stop = stop or threading.Event()
    try:
        if spec.method == POOL_METHOD:  # a co-training pool's worker, not a training loop
            from tuneforge.train.cotrain_worker import run_pool_attempt

            return TrainerExit(run_pool_attempt(spec, store, reporter, stop))
        if spec.method not in methods.names() or spec.training_type not in TRAINING_TYPES:
            raise UnsupportedJob(
                f"this trainer runs methods {', '.join(methods.names())} with training types "
                f"{', '.join(TRAINING_TYPES)}; got {spec.method!r} / {spec.training_type!r}"
            )
        objective = objectives.build(methods.get(spec.method), spec.hyperparameters.method_options)
        if spec.shared_pool:  # a small job whose steps run on its base's shared co-training worker
            from tuneforge.train.pool_client import run_on_pool

            return run_on_pool(spec, store, reporter, stop, objective)
        from tuneforge.train.loop import run_training

        return run_training(spec, store, reporter, stop, objective,
                            hooks if hooks is not None else faults_from_extra(spec.extra))
    except AttemptFenced as exc:
        log.error("%s", exc)
        return TrainerExit.FENCED
    except ReportRefused as exc:
        return end_refused(reporter, exc)
    except BadDataError as exc:
        _fail(reporter, "user", exc.code, str(exc))
        return TrainerExit.USER_ERROR
    except UserInputError as exc:
        _fail(reporter, "user", exc.code, str(exc), param=exc.param)
        return TrainerExit.USER_ERROR
    except (TrainingDiverged, UnsupportedJob) as exc:
        _fail(reporter, "user", exc.code, str(exc))
        return TrainerExit.USER_ERROR
    except (torch.OutOfMemoryError, MemoryError):
        _fail(reporter, "out_of_memory", "out_of_memory", OOM_MESSAGE)
        return TrainerExit.OUT_OF_MEMORY
    except Exception:  # the attempt must always end with a code the scheduler understands
        _fail(reporter, "platform", "platform_error", PLATFORM_MESSAGE)
        return TrainerExit.PLATFORM_ERROR


def end_refused(reporter: Reporter, refusal: ReportRefused) -> TrainerExit:
    """End the attempt on a refused report: one `report_refused` failure naming the report."""
    by = f"by the control plane (HTTP {refusal.status})" if refusal.status is not None else "by its own check"
    message = REFUSED_MESSAGE.format(kind=refusal.kind, by=by, reason=refusal.reason.rstrip("."))
    _fail(reporter, "report_refused", ReportRefused.code, message)
    return TrainerExit.REPORT_REFUSED


def _fail(reporter: Reporter, classification: str, code: str, message: str, *, param: str | None = None) -> None:
    """Log the exception being handled, with its traceback, under a new correlation id; report
    what the tenant may see of it."""
    error_id = correlation_id("err")
    log.error("attempt failed [%s] class=%s code=%s: %s", error_id, classification, code, message,
              exc_info=sys.exc_info()[0] is not None)
    if reporter.fenced:
        return
    reporter.report("failure", {"classification": classification, "code": code, "message": message,
                                "param": param, "correlation_id": error_id})
