"""One verifying TLS context per process, shared by the platform's HTTP clients.

An httpx client left to itself builds a new `ssl.SSLContext` and loads certifi's
bundle of ~150 CA certificates into it: 20-40 ms of CPU per client, paid again by
every short-lived client (a webhook dispatcher, a vLLM control call, an egress
client per delivery). The context below is the one httpx builds for `verify=True`
without `trust_env` (certifi's bundle, the system's default TLS settings), built
once; an `SSLContext` is safe to share between clients and threads, which only
read it. Clients that honour SSL_CERT_FILE (`trust_env=True`) keep building their own.
"""

from __future__ import annotations

import ssl
import threading
from typing import Any

_lock = threading.Lock()
_context: ssl.SSLContext | None = None


def verified_context() -> ssl.SSLContext:
    """The process's shared context: certificates and host names verified against certifi's CAs."""
    global _context
    with _lock:
        if _context is None:
            import httpx

            _context = httpx.create_ssl_context(trust_env=False)  # httpx's own default, built once
        return _context


def verify_option(verify: Any) -> Any:
    """`verify` as an httpx client takes it, with `True` replaced by the shared context."""
    return verified_context() if verify is True else verify
