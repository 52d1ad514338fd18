"""/healthz and /readyz for load balancers and Kubernetes probes.

/healthz: the process answers (liveness; never touches the database).
/readyz: this process can serve: the database answers, its schema is at this code's head, the
object store takes a write, and some control plane holds the scheduler's lock. 200 when all
hold, else 503 naming the failing checks; the details go to the operator's log, never to the
caller. A probe's result is kept for a couple of seconds so probes cannot load the backends."""

from __future__ import annotations

import logging
import os
import threading
import time

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from tuneforge import __version__
from tuneforge.db.migrate import current_revision, head_revision
from tuneforge.db.repos.health import ping
from tuneforge.scheduler.leader import leader_known
from tuneforge.services.context import Platform

log = logging.getLogger(__name__)
READY_MEMO_S = 2.0
READY_DEADLINE_S = 10.0
PROBE_KEY = "_health/probe-{pid}"


def _database(platform: Platform) -> str:
    with platform.db.engine.connect() as conn:
        ping(conn)
    return "ok"


def _migrations(platform: Platform) -> str:
    return "ok" if current_revision(platform.db.engine) == head_revision() else "not_at_head"


def _object_store(platform: Platform) -> str:
    key = PROBE_KEY.format(pid=os.getpid())
    platform.store.put_bytes(key, b"ok")
    platform.store.delete(key)
    return "ok"


def _scheduler(platform: Platform) -> str:
    if platform.scheduler_role == "leader":
        return "ok"
    settings = platform.settings
    return "ok" if leader_known(settings.resolved_database_url, settings.home) else "no_leader"


CHECKS = {"database": _database, "migrations": _migrations, "object_store": _object_store,
          "scheduler": _scheduler}


class Readiness:
    def __init__(self, platform: Platform) -> None:
        self.platform = platform
        self._lock = threading.Lock()
        self._last: tuple[float, dict[str, str]] | None = None

    def checks(self) -> dict[str, str]:
        with self._lock:  # one probe at a time; the others take its answer
            now = time.monotonic()
            if self._last is not None and now - self._last[0] < READY_MEMO_S:
                return self._last[1]
            results: dict[str, str] = {}
            for name, check in CHECKS.items():
                try:
                    results[name] = check(self.platform)
                except Exception as exc:  # noqa: BLE001 - a failing backend is the answer, not an error
                    log.warning("readiness check %s failed: %s", name, exc)
                    results[name] = "unavailable"
            self._last = (time.monotonic(), results)
            return results


def install(app: FastAPI, platform: Platform) -> None:
    # The probes are module functions that find the platform and its readiness on the app they
    # answer for, as every API route does: an endpoint made per app (a closure over it) stays
    # referenced from FastAPI's caches of endpoint callables, and the app's platform with it.
    app.state.readiness = Readiness(platform)
    app.add_api_route("/healthz", _healthz, methods=["GET"], include_in_schema=False)
    app.add_api_route("/readyz", _readyz, methods=["GET"], include_in_schema=False)


async def _healthz(request: Request) -> dict:  # async: no trip through the thread pool
    # scheduler: "leader" (this process schedules), "standby" (another one does), "parent" (an API worker
    # of `tuneforge serve`, whose parent process runs the scheduler), "off" (API only)
    platform = request.app.state.platform
    role = platform.scheduler_role
    if role == "off" and platform.settings.scheduler_in_parent:
        role = "parent"
    return {"status": "ok", "version": __version__, "scheduler": role, "pid": os.getpid()}


async def _readyz(request: Request) -> JSONResponse:
    readiness: Readiness = request.app.state.readiness
    try:
        with anyio.fail_after(READY_DEADLINE_S):
            checks = await anyio.to_thread.run_sync(readiness.checks, abandon_on_cancel=True)
    except TimeoutError:
        checks = {"deadline": "exceeded"}
    ready = all(value == "ok" for value in checks.values())
    return JSONResponse({"status": "ready" if ready else "not_ready", "version": __version__,
                         "checks": checks}, status_code=200 if ready else 503)
