"""The control plane process: migrations, API, scheduler and executor together.

`ControlPlane` runs in the foreground (`tuneforge up` / `serve`) or in a
background thread (the demo and end-to-end tests).

With `api_workers` > 1 (`serve_forever` only) the API runs in that many worker processes that
share one listening socket (uvicorn's supervisor, which also restarts a worker that dies),
while this process keeps the one scheduler, executor and webhook dispatcher: requests use every
core, scheduling stays in one place. Each worker builds its own app from the same settings
(`worker_app`, imported by name in the worker).
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import threading
import time

import uvicorn
from uvicorn.supervisors import Multiprocess

from tuneforge import prometheus
from tuneforge.api.app import create_app
from tuneforge.api.ratelimits import RequestLimiter
from tuneforge.db.migrate import upgrade
from tuneforge.executors import make_executor
from tuneforge.heap import FrozenHeap
from tuneforge.scheduler.loop import Scheduler
from tuneforge.security.env import private_dirs
from tuneforge.security.redact import redact_url
from tuneforge.services.context import Platform
from tuneforge.services.webhooks.delivery import Dispatcher
from tuneforge.settings import Settings

PR_SET_PDEATHSIG = 1


def worker_app():  # noqa: ANN201 - a FastAPI app; uvicorn calls this in each API worker process
    """The API of one worker process of a multi-worker control plane (API only: the parent
    process runs the scheduler). Settings come from the environment the parent passed on."""
    _exit_with_parent()
    configure_logging()
    settings = Settings()
    # the workers count tenants' requests together (default: HOME/ratelimit.db) and share their in-flight bound
    limiter = RequestLimiter.from_settings(settings, workers=settings.resolved_api_workers)
    return FrozenHeap(create_app(settings, rate_limiter=limiter))


def _exit_with_parent() -> None:
    """Linux: this process gets SIGTERM when its parent dies, even by SIGKILL, so an API worker
    never outlives the process that runs the scheduler (and never keeps the port)."""
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: the supervisor's own shutdown still applies
        return
    if os.getppid() != parent:  # the parent died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


class ControlPlane:
    def __init__(self, settings: Settings, *, run_scheduler: bool = True, migrate: bool = True) -> None:
        self.settings = settings
        if migrate:
            private_dirs(settings.home)
            upgrade(settings.resolved_database_url)
        self.platform = Platform.from_settings(settings)
        self.app = create_app(settings, platform=self.platform)
        self.executor = make_executor(settings) if run_scheduler else None
        self.scheduler = Scheduler(self.platform, self.executor) if self.executor is not None else None
        if self.executor is not None:
            # jobs created before the first tick are checked against the real inventory too
            self.platform.inventory = self.executor.capacity()
        # every control plane sends webhooks; their claim keeps two from sending one attempt twice
        self.webhooks = Dispatcher(self.platform)
        config = uvicorn.Config(self.app, host=settings.host, port=settings.port, log_level="warning",
                                access_log=False, timeout_graceful_shutdown=5)
        self.server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None
        self._training_api_server: uvicorn.Server | None = None  # with API workers: the training API's

    @property
    def url(self) -> str:
        return self.settings.resolved_public_url

    def serve_forever(self) -> None:
        if self.scheduler:
            self.scheduler.start()
        self.webhooks.start()
        try:
            if self.settings.resolved_api_workers > 1:
                self._run_workers()
            else:
                # this process serves until it exits (unlike an in-process plane of the tests)
                self.server.config.app = FrozenHeap(self.app)
                self.server.run()
        finally:
            self.close()

    def _run_workers(self) -> None:
        """The API in `api_workers` processes on one socket until SIGINT/SIGTERM (blocks)."""
        # The workers read their settings from the environment: what this process was given
        # otherwise (the CLI's --host/--port) is passed the same way.
        for name, value in (("TUNEFORGE_HOST", self.settings.host), ("TUNEFORGE_PORT", self.settings.port),
                            ("TUNEFORGE_API_WORKERS", self.settings.resolved_api_workers)):
            os.environ[name] = str(value)
        # the training API's state lives in one process: this one serves it on a loopback port and the
        # workers forward it there (api/forward.py)
        os.environ["TUNEFORGE_TRAINING_API_UPSTREAM"] = self._serve_training_api()
        # a worker's /healthz says where the scheduler runs: in this process, not in the worker
        os.environ["TUNEFORGE_SCHEDULER_IN_PARENT"] = "1" if self.scheduler is not None else "0"
        # their request and trainer counters go to one folder that any worker's /metrics sums
        prometheus.prepare_multiprocess(self.settings.home)
        config = uvicorn.Config("tuneforge.server:worker_app", factory=True, host=self.settings.host,
                                port=self.settings.port, workers=self.settings.resolved_api_workers,
                                log_level="warning", access_log=False, timeout_graceful_shutdown=5)
        Multiprocess(config, sockets=[config.bind_socket()]).run()

    def _serve_training_api(self) -> str:
        """This process's app on 127.0.0.1 (a free port) for the API workers to forward the training
        API to: its sessions, models and co-training pools stay in this one process. Its URL."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        config = uvicorn.Config(self.app, host="127.0.0.1", port=port, log_level="warning", access_log=False,
                                timeout_graceful_shutdown=5)
        self._training_api_server = uvicorn.Server(config)
        threading.Thread(target=self._training_api_server.run, kwargs={"sockets": [listener]},
                         name="tuneforge-training-api", daemon=True).start()
        deadline = time.monotonic() + 30.0
        while not self._training_api_server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        return f"http://127.0.0.1:{port}"

    def start_in_background(self, timeout_s: float = 30.0) -> ControlPlane:
        if self.scheduler:
            self.scheduler.start()
        self.webhooks.start()
        self._thread = threading.Thread(target=self.server.run, name="tuneforge-api", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"the API did not start on {redact_url(self.url)}")
            time.sleep(0.05)
        return self

    def close(self) -> None:
        if self.scheduler:
            self.scheduler.stop()
        self.webhooks.stop()
        self.app.state.training_api.close()  # the co-training workers this process started
        if self._training_api_server is not None:
            self._training_api_server.should_exit = True
        # open event streams end now (clients resume with Last-Event-ID) rather than hold the shutdown
        self.platform.streams.close()
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(10)
        if self.executor is not None:
            self.executor.close()  # disconnects; running attempts carry on
            self.executor = None
        self.platform.db.dispose()

    def __enter__(self) -> ControlPlane:
        return self.start_in_background()

    def __exit__(self, *_exc) -> None:
        self.close()


def configure_logging(level: str = "INFO") -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
