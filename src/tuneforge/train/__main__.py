"""`python -m tuneforge.train SPEC.json`: run one attempt of one job, then exit.

The exit code (`tuneforge.domain.exit_codes.TrainerExit`) tells the executor
how the attempt ended; the reports tell the control plane what happened.
SIGTERM asks for a clean stop: the current optimizer step finishes, a
checkpoint is written, the reports are flushed and the process exits 12.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import NoReturn

from tuneforge.domain.exit_codes import TrainerExit
from tuneforge.domain.spec import JobSpec
from tuneforge.security.redact import redact_url

log = logging.getLogger("tuneforge.train")

# A success is only a success once the control plane has the result; failures
# and preemptions are told by the exit code as well, so they wait less.
RESULT_FLUSH_TIMEOUT_S = 120.0
OTHER_FLUSH_TIMEOUT_S = 15.0


def _configure_process() -> None:
    from tuneforge.security.env import restrict_umask

    restrict_umask()  # checkpoints, caches and logs of tenants' jobs are this user's only
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # Base models come from the object store; the trainer never talks to a model hub.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tuneforge.train", description=__doc__)
    parser.add_argument("spec", help="path of the JobSpec JSON file")
    args = parser.parse_args(argv)
    # The handler goes in before anything slow (imports, logging set-up): a
    # preemption notice that arrives while the process starts is still a notice.
    stop = threading.Event()

    def preempted(_signum: int, _frame: object) -> None:
        stop.requested_at = time.monotonic()  # type: ignore[attr-defined] - the grace period counts from here
        stop.set()

    signal.signal(signal.SIGTERM, preempted)
    # a trainer forked warm (train/warm.py) starts with SIGTERM blocked, so that a notice sent
    # before this handler was in place waits for it: it arrives now
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    code = _main(args.spec, stop)
    if os.environ.get("RANK", "0") == "0":  # rank 0 speaks for a multi-process attempt
        write_exit_file(args.spec, code)
    return code


def run_forked(spec_path: str, env: dict[str, str], prepare: Callable[[], None]) -> NoReturn:
    """The rest of a process forked from one that has imported the trainer (an attempt forked by
    train/warm.py, a rank forked by rank 0 in train/distributed.py): `prepare` (its standard
    streams, session, folder), then `env` in place of the inherited environment and `main` for the
    spec, as a fresh `python -m tuneforge.train SPEC` would run; it exits with the trainer's code,
    whatever escapes printed to its stderr."""
    code = int(TrainerExit.PLATFORM_ERROR)
    try:
        prepare()
        os.environ.clear()
        os.environ.update(env)
        sys.argv = [sys.argv[0], spec_path]
        code = int(main([spec_path]))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else int(TrainerExit.PLATFORM_ERROR)
    except BaseException:  # noqa: BLE001 - the process's last word goes to its log, then it exits
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001, S110 - nothing is left to tell
                pass
    os._exit(code)


def exit_file(spec_path: str) -> str:
    """Where the trainer leaves its exit code: beside its spec, so an executor that did
    not launch it (a restarted control plane) can still tell how it ended."""
    base, _ext = os.path.splitext(spec_path)
    return base + ".exit"


def read_exit_file(spec_path: str) -> int | None:
    """The exit code a trainer left beside its spec as its last act; None without one (a trainer
    still running, or one killed before a parent could write it)."""
    if not spec_path:
        return None
    try:
        with open(exit_file(spec_path)) as handle:
            return int(handle.read().strip())
    except (OSError, ValueError):
        return None


def write_exit_file(spec_path: str, code: int) -> None:
    path = exit_file(spec_path)
    try:
        with open(path + ".tmp", "w") as handle:
            handle.write(f"{int(code)}\n")
        os.replace(path + ".tmp", path)
    except OSError as exc:  # the executor then knows no more than without the file
        log.warning("cannot write the exit code to %s: %s", path, exc)


def _main(spec_path: str, stop: threading.Event) -> int:
    _configure_process()
    try:
        spec = JobSpec.read(spec_path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.error("cannot read the job spec %s: %s", spec_path, exc)
        return TrainerExit.PLATFORM_ERROR
    if stop.is_set():
        log.info("a preemption notice came during start-up")

    from tuneforge.train import distributed
    from tuneforge.train.reporter import SilentReporter
    from tuneforge.train.runner import run_attempt

    rank, world = distributed.rank_from_env()
    if rank > 0:  # a worker rank of a multi-process attempt: train, say nothing
        return int(run_attempt(spec, _open_store(spec), SilentReporter(), stop))
    workers = distributed.launch_workers(spec_path, spec.gpus) if spec.gpus > 1 and world == 1 else []
    try:
        return _run_reporting(spec, stop)
    finally:
        distributed.stop_workers(workers)


def _open_store(spec: JobSpec):  # noqa: ANN202
    """The attempt's object store: by default the control plane's object proxy, with the job token
    (storage/proxy.py); the store itself only where the operator chose TUNEFORGE_TRAINER_STORAGE=direct."""
    from tuneforge.storage.proxy import ProxyStore, is_proxy_url

    if is_proxy_url(spec.storage_url):
        return ProxyStore(spec.storage_url, spec.job_token)

    from tuneforge.settings import Settings
    from tuneforge.storage.store import open_store

    return open_store(spec.storage_url, Settings(storage_url=spec.storage_url).storage_options())


def _run_reporting(spec: JobSpec, stop: threading.Event) -> int:
    """Run the attempt with reports to the control plane, delivered before exiting."""
    from tuneforge.train.reporter import HttpReporter
    from tuneforge.train.runner import end_refused, run_attempt

    reporter = HttpReporter(
        spec.callback_url, spec.job_id, spec.attempt, spec.job_token,
        heartbeat_interval_s=spec.heartbeat_interval_s,
    ).start()
    code = TrainerExit.PLATFORM_ERROR
    try:
        store = _open_store(spec)
        code = run_attempt(spec, store, reporter, stop)
    except Exception:  # the store itself could not be opened
        log.exception("cannot open the object store %s", redact_url(spec.storage_url))
    finally:
        timeout_s = RESULT_FLUSH_TIMEOUT_S if code == TrainerExit.SUCCESS else OTHER_FLUSH_TIMEOUT_S
        delivered = reporter.flush(timeout_s)
        if reporter.refusal is not None and code != TrainerExit.REPORT_REFUSED and not reporter.fenced:
            # refused while the last reports were flushed (the result, say): end once, with its class
            code = end_refused(reporter, reporter.refusal)
            delivered = reporter.flush(OTHER_FLUSH_TIMEOUT_S)
        reporter.close()
    if reporter.fenced:
        return TrainerExit.FENCED
    if code == TrainerExit.SUCCESS and not delivered:
        log.error("the result was not delivered within %.0f s", RESULT_FLUSH_TIMEOUT_S)
        return TrainerExit.PLATFORM_ERROR
    log.info("exit %d (%s)", int(code), TrainerExit(code).name.lower())
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
