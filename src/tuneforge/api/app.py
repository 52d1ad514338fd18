"""The FastAPI application factory."""

from __future__ import annotations

from fastapi import FastAPI

from tuneforge import __version__
from tuneforge.api import errors, openapi
from tuneforge.api.guard import RequestGuard
from tuneforge.api.routes import admin, files, inference, internal, jobs, metrics, models, usage, webhooks
from tuneforge.services.context import Platform
from tuneforge.settings import Settings


def create_app(settings: Settings | None = None, *, platform: Platform | None = None) -> FastAPI:
    if platform is None:
        platform = Platform.from_settings(settings or Settings())
    app = FastAPI(title="tuneforge", version=__version__, summary="OpenAI-compatible fine-tuning platform")
    app.state.platform = platform
    errors.install(app)
    app.add_middleware(RequestGuard)
    for router in (files.router, jobs.router, models.router, usage.router, metrics.router, admin.router,
                   internal.router, inference.router, webhooks.router):
        app.include_router(router)
    openapi.install(app)

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> dict:
        # scheduler: "leader" (this process schedules), "standby" (another one does), "off" (API only)
        return {"status": "ok", "version": __version__, "scheduler": platform.scheduler_role}

    return app
