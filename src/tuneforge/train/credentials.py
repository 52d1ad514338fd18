"""The trainer asks the control plane for its eval endpoints' credentials.

A job config names secrets and operator endpoints, never holds a credential;
the trainer gets the values it needs here, once, authenticated by its job
token, for its own (current) attempt only. Nothing is written to disk or put
in the environment.
"""

from __future__ import annotations

from typing import Any

import httpx

from tuneforge.eval.openai_chat import ChatEndpointError, Credentials

_TIMEOUT_S = 30.0


def fetch(spec: Any, *, client: httpx.Client | None = None) -> Credentials:
    """The credentials of `spec`'s attempt; ChatEndpointError when the control plane gives none."""
    url = f"{spec.callback_url.rstrip('/')}/internal/v1/jobs/{spec.job_id}/credentials"
    http = client or httpx.Client(timeout=_TIMEOUT_S, trust_env=False)
    try:
        response = http.get(url, params={"attempt": spec.attempt},
                            headers={"Authorization": f"Bearer {spec.job_token}"})
    except httpx.HTTPError as exc:
        raise ChatEndpointError(f"the eval credentials could not be fetched ({type(exc).__name__})") from None
    finally:
        if client is None:
            http.close()
    if response.status_code != 200:
        raise ChatEndpointError(f"the eval credentials could not be fetched (HTTP {response.status_code})")
    body = response.json()
    return Credentials(secrets=dict(body.get("secrets") or {}), endpoints=dict(body.get("endpoints") or {}))
