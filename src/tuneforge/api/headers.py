"""Response headers: security headers on every response, headers a request's handling left for
its answer (the rate-limit headers), and download names built from tenant-chosen text.

A pure ASGI middleware: it rewrites only the `http.response.start` message and passes
every body chunk on as it comes, so streamed responses (Server-Sent Events of job
events and chat completions) are never buffered.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import quote

from starlette.types import ASGIApp, Message, Receive, Scope, Send

# Nothing an API response carries is meant to run or be framed in a browser. A page that
# needs more (the API reference) sets its own Content-Security-Policy, which is kept.
API_CSP = "default-src 'none'; frame-ancestors 'none'"
API_CSP_RAW = API_CSP.encode("latin-1")

# Scope key of a dict of headers that the answer to this request carries, whatever answers it (a
# route's own Response object included): set by the request's dependencies (api/ratelimits.py).
ANSWER_HEADERS = "tuneforge.answer_headers"

ALWAYS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    # answers carry tenants' data and keys: no cache (browser or proxy) keeps them
    "Cache-Control": "no-store",
}
_ALWAYS_RAW = {name.lower().encode("latin-1"): value.encode("latin-1") for name, value in ALWAYS.items()}
_CSP = b"content-security-policy"


class SecurityHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = with_answer_headers(message.get("headers", ()), scope.get(ANSWER_HEADERS))
            await send(message)

        await self.app(scope, receive, send_with_headers)


def with_answer_headers(headers: Iterable[tuple[bytes, bytes]], extra: dict[str, str] | None) -> list:
    """The response's raw headers with ALWAYS and `extra` set (replacing any of the same name),
    and the API's Content-Security-Policy unless the response set its own."""
    setting = _ALWAYS_RAW
    if extra:
        setting = {**setting, **{name.lower().encode("latin-1"): value.encode("latin-1")
                                 for name, value in extra.items()}}
    kept = [(name, value) for name, value in headers if name.lower() not in setting]
    own_csp = any(name.lower() == _CSP for name, _ in kept)
    kept.extend(setting.items())
    if not own_csp:
        kept.append((_CSP, API_CSP_RAW))
    return kept


_NOT_PLAIN = re.compile(r'[^\x20-\x7e]|["\\]')


def attachment(filename: str) -> str:
    """`Content-Disposition` for a download named `filename`: an ASCII fallback (`filename=`, other
    characters as `_`) for old clients and the exact name in RFC 5987's `filename*=UTF-8''...`.
    Header values are Latin-1 on the wire: a non-ASCII name written as is cannot be sent."""
    fallback = _NOT_PLAIN.sub("_", filename) or "download"
    if fallback == filename:
        return f'attachment; filename="{filename}"'
    exact = quote(filename.encode("utf-8", "surrogatepass"), safe="")
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{exact}"
