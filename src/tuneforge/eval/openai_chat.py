"""One chat completion from an OpenAI-compatible endpoint (`POST {endpoint}/chat/completions`).

The LLM judge and the guard-model refusal detector both ask a model for a
one-word verdict; this is the single place that speaks that protocol, so both
report unreachable endpoints, timeouts and bad answers the same way.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import httpx

# characters of an error body quoted in the message: enough to see the server's reason
_BODY_EXCERPT_CHARS = 200


class ChatEndpointError(Exception):
    """The endpoint could not be asked or its answer could not be read."""


@dataclass(frozen=True)
class ChatEndpoint:
    """Where a verdict model is served and how to call it."""

    endpoint: str
    """Base URL of the OpenAI-compatible API, e.g. http://127.0.0.1:9999/v1 (no trailing /chat/completions)."""
    model: str
    """The `model` field sent with each request."""
    api_key_env: str | None = None
    """Name of an environment variable holding the API key (sent as a Bearer token); none sends no key."""
    timeout_s: float = 60.0
    """Seconds one request may take before it counts as failed."""

    @property
    def url(self) -> str:
        return self.endpoint.rstrip("/") + "/chat/completions"


def _headers(target: ChatEndpoint) -> dict[str, str]:
    if not target.api_key_env:
        return {}
    key = os.environ.get(target.api_key_env)
    if not key:
        raise ChatEndpointError(f"environment variable {target.api_key_env} (the API key for {target.url}) is not set")
    return {"Authorization": f"Bearer {key}"}


def complete(target: ChatEndpoint, messages: list[dict[str, str]], *, client: httpx.Client | None = None) -> str:
    """The assistant's reply text to `messages`, sampled greedily (temperature 0)."""
    body = {"model": target.model, "messages": messages, "temperature": 0}
    owned = client is None
    http = client if client is not None else httpx.Client()
    try:
        response = http.post(target.url, json=body, headers=_headers(target), timeout=target.timeout_s)
    except httpx.TimeoutException:
        raise ChatEndpointError(f"{target.url} did not answer within {target.timeout_s:g} s") from None
    except httpx.HTTPError as exc:
        raise ChatEndpointError(f"{target.url} could not be reached: {exc}") from None
    finally:
        if owned:
            http.close()
    if response.status_code >= 400:
        excerpt = response.text[:_BODY_EXCERPT_CHARS]
        raise ChatEndpointError(f"{target.url} answered HTTP {response.status_code}: {excerpt}")
    return _reply_text(target, response)


def _reply_text(target: ChatEndpoint, response: httpx.Response) -> str:
    try:
        content = response.json()["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise ChatEndpointError(f"{target.url} answered HTTP {response.status_code} without "
                                "choices[0].message.content") from None
    if not isinstance(content, str):
        raise ChatEndpointError(f"{target.url} answered a non-text message content")
    return content
