"""The control plane process: migrations, API, scheduler and executor together.

`ControlPlane` runs in the foreground (`tuneforge up` / `serve`) or in a
background thread (the demo and end-to-end tests).
"""

from __future__ import annotations

import logging
import threading
import time

import uvicorn

from tuneforge.api.app import create_app
from tuneforge.db.migrate import upgrade
from tuneforge.executors import make_executor
from tuneforge.scheduler.loop import Scheduler
from tuneforge.security.env import private_dirs
from tuneforge.security.redact import redact_url
from tuneforge.services.context import Platform
from tuneforge.services.webhook_delivery import Dispatcher
from tuneforge.settings import Settings


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

    @property
    def url(self) -> str:
        return self.settings.resolved_public_url

    def serve_forever(self) -> None:
        if self.scheduler:
            self.scheduler.start()
        self.webhooks.start()
        try:
            self.server.run()
        finally:
            self.close()

    def start_in_background(self, timeout_s: float = 30.0) -> "ControlPlane":
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
        # open event streams end now (clients resume with Last-Event-ID) rather than hold the shutdown
        self.platform.streams.close()
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(10)
        if self.executor is not None:
            self.executor.close()  # disconnects; running attempts carry on
            self.executor = None
        self.platform.db.dispose()

    def __enter__(self) -> "ControlPlane":
        return self.start_in_background()

    def __exit__(self, *_exc) -> None:
        self.close()


def configure_logging(level: str = "INFO") -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
