"""The API reference: /openapi.json, /docs (Swagger UI) and /redoc, as TUNEFORGE_DOCS_ACCESS says.

"off"     not served (404), though `app.openapi()` still works in-process;
"admin"   served to the admin Bearer key only (and not at all when none is configured);
"public"  served to anyone.

The pages carry the schema inline, so a browser needs no second, authenticated request for
it, and each page has a Content-Security-Policy that allows only what it loads: its own
script (by nonce) and the viewer's files from the CDN.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from fastapi import Depends, FastAPI, Header, Request
from fastapi.responses import HTMLResponse, JSONResponse

from tuneforge.api.routes.admin import admin
from tuneforge.domain.errors import ApiError

ACCESS = ("public", "admin", "off")

_CDN = "https://cdn.jsdelivr.net"
_SWAGGER = f"{_CDN}/npm/swagger-ui-dist@5"
_REDOC = f"{_CDN}/npm/redoc@2/bundles/redoc.standalone.js"


def _inline_json(value: Any) -> str:
    """JSON that is safe inside a <script> element: no '<', '>' or '&' can end or open a tag."""
    text = json.dumps(value, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _page(title: str, head: str, body: str, script: str, csp: str, nonce: str) -> HTMLResponse:
    html = (f"<!doctype html><html><head><meta charset=\"utf-8\"><title>{title}</title>{head}</head>"
            f"<body>{body}<script nonce=\"{nonce}\">{script}</script></body></html>")
    return HTMLResponse(html, headers={"Content-Security-Policy": csp})


def _csp(nonce: str, *extra: str) -> str:
    return "; ".join((
        "default-src 'none'", f"script-src 'nonce-{nonce}' {_CDN}", f"style-src 'unsafe-inline' {_CDN}",
        f"img-src 'self' data: {_CDN}", "connect-src 'self'", *extra,
        "base-uri 'none'", "form-action 'none'", "frame-ancestors 'none'"))


def install(app: FastAPI, access: str, admin_key_set: bool) -> None:
    """Add the reference routes to `app` (build it with openapi_url, docs_url and redoc_url None)."""
    if access not in ACCESS:
        raise ValueError(f"docs access must be one of {', '.join(ACCESS)}, not {access!r}")
    paths = (("/openapi.json", _openapi_schema), ("/docs", _swagger_page), ("/redoc", _redoc_page))
    if access == "off" or (access == "admin" and not admin_key_set):
        for path, _endpoint in paths:  # not served: say so, and how an operator turns it on
            app.add_api_route(path, _not_served, methods=["GET"], include_in_schema=False)
        return
    guard = [Depends(_admin_only)] if access == "admin" else []
    # module functions reading the app they answer for: a closure over `app` would stay
    # referenced from FastAPI's caches of endpoint callables, and the app with it
    for path, endpoint in paths:
        app.add_api_route(path, endpoint, methods=["GET"], include_in_schema=False, dependencies=guard)


NOT_SERVED = ("The API reference is not served by this server. The operator turns it on with "
              "TUNEFORGE_DOCS_ACCESS=public (anyone) or with TUNEFORGE_ADMIN_API_KEY set (the admin key only). "
              "The web console is at /console; the endpoints are described in docs/api.md.")
ADMIN_ONLY = ("The API reference is served to the admin key only (TUNEFORGE_DOCS_ACCESS=admin): fetch it with "
              "`curl -H \"Authorization: Bearer $TUNEFORGE_ADMIN_API_KEY\" {base}/openapi.json`, or ask the "
              "operator for TUNEFORGE_DOCS_ACCESS=public. The web console is at {base}/console.")


def _not_served(request: Request) -> JSONResponse:
    raise ApiError(404, NOT_SERVED, code="docs_not_served")


def _admin_only(request: Request, authorization: str | None = Header(default=None)) -> None:
    try:
        admin(authorization, request.app.state.platform)
    except ApiError as exc:
        base = str(request.base_url).rstrip("/")
        raise ApiError(exc.status_code, ADMIN_ONLY.format(base=base), type=exc.type, code=exc.code) from None


def _openapi_schema(request: Request) -> JSONResponse:
    return JSONResponse(request.app.openapi())


def _swagger_page(request: Request) -> HTMLResponse:
    app = request.app
    nonce = secrets.token_urlsafe(16)
    script = (f"SwaggerUIBundle({{spec: {_inline_json(app.openapi())}, dom_id: '#swagger-ui', "
              "validatorUrl: null, deepLinking: true});")
    return _page(f"{app.title} - API reference",
                 f"<link rel=\"stylesheet\" href=\"{_SWAGGER}/swagger-ui.css\">"
                 f"<script src=\"{_SWAGGER}/swagger-ui-bundle.js\" nonce=\"{nonce}\"></script>",
                 "<div id=\"swagger-ui\"></div>", script, _csp(nonce), nonce)


def _redoc_page(request: Request) -> HTMLResponse:
    app = request.app
    nonce = secrets.token_urlsafe(16)
    script = f"Redoc.init({_inline_json(app.openapi())}, {{}}, document.getElementById('redoc'));"
    return _page(f"{app.title} - API reference",
                 f"<script src=\"{_REDOC}\" nonce=\"{nonce}\"></script>",
                 "<div id=\"redoc\"></div>", script, _csp(nonce, "worker-src blob:"), nonce)
