"""The trainer asks the control plane for its eval endpoints' and trackers' credentials.

A job config names secrets and operator endpoints, never holds a credential;
the trainer gets the values it needs here, once, authenticated by its job
token, for its own (current) attempt only. Nothing is written to disk or put
in the environment.
"""

from __future__ import annotations

from typing import Any

import httpx

from tuneforge.eval.openai_chat import ChatEndpointError, Credentials
from tuneforge.security.tls import verified_context

_TIMEOUT_S = 30.0


def fetch(spec: Any, *, client: httpx.Client | None = None) -> Credentials:
    """The eval credentials of `spec`'s attempt; ChatEndpointError when the control plane gives none."""
    body = _body(spec, client, ChatEndpointError, "the eval credentials")
    return Credentials(secrets=dict(body.get("secrets") or {}), endpoints=dict(body.get("endpoints") or {}))


def fetch_tracking(spec: Any, *, client: httpx.Client | None = None) -> dict[str, dict[str, Any]]:
    """Per integration, the tracking server and the tenant's credentials (train/tracking.py);
    OSError when the control plane gives none."""
    return dict(_body(spec, client, OSError, "the tracking credentials").get("tracking") or {})


def _body(spec: Any, client: httpx.Client | None, error: type[Exception], what: str) -> dict[str, Any]:
    url = f"{spec.callback_url.rstrip('/')}/internal/v1/jobs/{spec.job_id}/credentials"
    http = client or httpx.Client(timeout=_TIMEOUT_S, trust_env=False, verify=verified_context())
    try:
        response = http.get(url, params={"attempt": spec.attempt},
                            headers={"Authorization": f"Bearer {spec.job_token}"})
    except httpx.HTTPError as exc:
        raise error(f"{what} could not be fetched ({type(exc).__name__})") from None
    finally:
        if client is None:
            http.close()
    if response.status_code != 200:
        raise error(f"{what} could not be fetched (HTTP {response.status_code})")
    return response.json()
