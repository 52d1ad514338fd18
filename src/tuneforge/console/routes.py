"""Serving the console's files at /console, each answer with the console's own
Content-Security-Policy.

The files are read once, when the routes are installed, from the package's `static/`
folder; only those files answer (no path is joined from a request, so nothing outside
the folder can be reached). The page is `/console` (and `/console/`); the client-side
router keeps its place in the URL's `#/...` fragment, so no other page path exists.
"""

from __future__ import annotations

from importlib import resources
from typing import TYPE_CHECKING

from fastapi import FastAPI
from fastapi.responses import RedirectResponse, Response

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

PREFIX = "/console"
INDEX = "index.html"

# Scripts, styles, images and API calls from this origin only; no inline script or style,
# no plugins, no framing, no form posting anywhere. Downloads are blob: URLs made by the page.
CONSOLE_CSP = "; ".join((
    "default-src 'self'",
    "script-src 'self'",
    "style-src 'self'",
    "img-src 'self' data: blob:",
    "connect-src 'self'",
    "font-src 'self'",
    "object-src 'none'",
    "base-uri 'none'",
    "form-action 'none'",
    "frame-ancestors 'none'",
))

MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".ico": "image/x-icon",
    ".png": "image/png",
}


def _walk(folder: Traversable, prefix: str = "") -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    for entry in folder.iterdir():
        name = f"{prefix}{entry.name}"
        if entry.is_dir():
            files.update(_walk(entry, f"{name}/"))
        elif any(name.endswith(suffix) for suffix in MEDIA_TYPES):
            files[name] = entry.read_bytes()
    return files


def static_files() -> dict[str, bytes]:
    """Every servable file of the console, by its path under /console/."""
    return _walk(resources.files("tuneforge.console").joinpath("static"))


def _media_type(name: str) -> str:
    return next(kind for suffix, kind in MEDIA_TYPES.items() if name.endswith(suffix))


def _answer(name: str, body: bytes) -> Response:
    return Response(body, media_type=_media_type(name), headers={"Content-Security-Policy": CONSOLE_CSP})


def _not_found() -> Response:
    return Response(b"Not found", status_code=404, media_type="text/plain; charset=utf-8",
                    headers={"Content-Security-Policy": CONSOLE_CSP})


def install(app: FastAPI) -> None:
    """Add the console's routes to `app` (GET and HEAD of /console, /console/ and its files)."""
    files = static_files()
    index = files[INDEX]

    async def page() -> Response:
        return _answer(INDEX, index)

    async def asset(path: str) -> Response:
        body = files.get(path)
        return _not_found() if body is None else _answer(path, body)

    async def root() -> Response:  # the service's address opened in a browser: its console
        return RedirectResponse(PREFIX, status_code=307)

    app.add_api_route("/", root, methods=["GET", "HEAD"], include_in_schema=False)
    for path in (PREFIX, f"{PREFIX}/"):
        app.add_api_route(path, page, methods=["GET", "HEAD"], include_in_schema=False)
    app.add_api_route(PREFIX + "/{path:path}", asset, methods=["GET", "HEAD"], include_in_schema=False)
