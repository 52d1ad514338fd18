"""The FastAPI application factory."""

from __future__ import annotations

import inspect
import threading

from fastapi import APIRouter, FastAPI
from starlette.routing import BaseRoute
from starlette.types import ASGIApp

from tuneforge import __version__, console
from tuneforge.api import docs, errors, forward, health, openapi
from tuneforge.api.audit import AuditTrail
from tuneforge.api.guard import RequestGuard
from tuneforge.api.headers import SecurityHeaders
from tuneforge.api.hot_path import HotPath
from tuneforge.api.keys import KeyLookups, TrainerTokens
from tuneforge.api.lean_reads import EventPages, JobBodies
from tuneforge.api.ratelimits import RefuseWhileOver, RequestLimiter
from tuneforge.api.routes import (
    admin,
    files,
    graders,
    inference,
    internal,
    jobs,
    metrics,
    models,
    objects,
    secrets,
    sweeps,
    tinker,
    traffic,
    uploads,
    usage,
    webhooks,
)
from tuneforge.prometheus import RequestMetrics
from tuneforge.services.context import Platform
from tuneforge.services.training.objects import Grants
from tuneforge.services.training_api import TrainingApiHost
from tuneforge.settings import Settings


class _App(FastAPI):
    def build_middleware_stack(self) -> ASGIApp:
        # outermost, so that even the answer to an unexpected error carries the security headers;
        # a tenant over its rate is refused before the hot path, which answers GET job before the app;
        # the audit trail sees each mutating request's answer as it leaves the app, errors included
        return SecurityHeaders(RefuseWhileOver(HotPath(AuditTrail(super().build_middleware_stack()), self.state),
                                               self.state))


def _telemetry(enabled: bool) -> dict:
    """FastAPI's own OpenTelemetry instrumentation, where this FastAPI has it: off unless asked
    for, since it looks up the global providers on every request even when none is configured
    (measured: a sixth of a cheap request's CPU)."""
    if "telemetry" not in inspect.signature(FastAPI.__init__).parameters:
        return {}
    return {"telemetry": {"tracing": enabled, "metrics": enabled, "logs": enabled}}


# The API's routers in the order a request is matched against them: the probes (health.install,
# per app) and the routes polled hardest come first (measured: matching /healthz against the fifty
# routes before it was a third of its CPU).
_ROUTERS = (jobs.router, files.router, uploads.router, models.router, usage.router, metrics.router,
            jobs.together_router, admin.router, objects.router, internal.router, inference.router, webhooks.router,
            secrets.router, traffic.router, sweeps.router, graders.router, tinker.router, tinker.internal)
_shared: list[BaseRoute] = []
_shared_lock = threading.Lock()


def _api_routes() -> list[BaseRoute]:
    """The routes of `_ROUTERS`, built once per process and shared by every app `create_app` makes:
    each reads its platform from `request.app.state`, so nothing in a route belongs to one app.
    Building them resolves every dependency and response model (FastAPI releases before ~0.16x do
    it again for each app they are included in: 0.3 s of CPU an app, measured at the lowest
    supported versions). Hence an app's `dependency_overrides` do not reach them: what varies
    between apps lives on `app.state` (e.g. `egress_resolver`)."""
    with _shared_lock:
        if not _shared:
            router = APIRouter()
            for included in _ROUTERS:
                router.include_router(included)
            _shared.extend(router.routes)
        return _shared


def create_app(settings: Settings | None = None, *, platform: Platform | None = None,
               rate_limiter: RequestLimiter | None = None) -> FastAPI:
    """The API of `platform` (else one built from `settings`). `rate_limiter`: the tenants' request
    limits; default, those of the only API process (a worker of several passes its own)."""
    if platform is None:
        platform = Platform.from_settings(settings or Settings())
    # the reference is served by docs.install, as TUNEFORGE_DOCS_ACCESS says; app.openapi() works regardless
    app = _App(title="tuneforge", version=__version__, summary="OpenAI-compatible fine-tuning platform",
               openapi_url=None, docs_url=None, redoc_url=None, **_telemetry(platform.settings.opentelemetry))
    app.state.platform = platform
    app.state.key_lookups = KeyLookups(platform)
    app.state.trainer_tokens = TrainerTokens(platform)
    app.state.object_grants = Grants(platform.db)
    app.state.job_bodies = JobBodies(platform)
    app.state.event_pages = EventPages(platform)
    app.state.rate_limiter = RequestLimiter.from_settings(platform.settings) if rate_limiter is None else rate_limiter
    app.state.training_api = TrainingApiHost(platform)
    app.state.egress_resolver = None  # how tenant-supplied hosts are resolved: None, the system's resolver
    errors.install(app)
    docs.install(app, platform.settings.docs_access, bool(platform.settings.admin_api_key))
    app.add_middleware(RequestGuard)
    app.add_middleware(RequestMetrics)  # outermost: every request's latency, refusals included
    # Routes are matched in order, each path tried against every route before it (see _ROUTERS)
    health.install(app, platform)
    if platform.settings.training_api_upstream:  # an API worker of several: the parent holds the training API
        app.router.routes.extend(forward.routes(platform.settings.training_api_upstream))
    app.router.routes.extend(_api_routes())
    console.install(app)  # the web console at /console (its routes are not in the API's schema)
    openapi.install(app)
    return app
