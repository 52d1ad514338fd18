"""One chat completion from an OpenAI-compatible endpoint (`POST {endpoint}/chat/completions`).

The LLM judge and the guard-model refusal detector both ask a model for a
one-word verdict; this is the single place that speaks that protocol, so both
report unreachable endpoints, timeouts and bad answers the same way.

Where the endpoint is and which credential it takes come from the job config,
which never holds a credential: it gives either

- `endpoint` (a URL of the tenant's; it passes the egress policy when the job
  is created and again when the trainer connects) and optionally
  `api_key_secret`, the name of one of the tenant's secrets (POST /v1/secrets),
- or `endpoint_name`, one of the endpoints the operator offers
  (`TUNEFORGE_EVAL_ENDPOINTS`), whose URL and key the tenant never sees.

The trainer gets the values it needs from the control plane (`Credentials`,
train/credentials.py) and binds them (`ChatEndpoint.bind`) before it asks.
Errors quote no part of the endpoint's reply: a tenant's URL could point at
something whose answer must not come back to the tenant.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from tuneforge.domain.errors import invalid
from tuneforge.security.tls import verified_context

ENDPOINT_OPTIONS = ("endpoint", "endpoint_name", "model", "api_key_secret", "timeout_s")
_MAX_URL_CHARS = 2048
_MAX_MODEL_CHARS = 256


class ChatEndpointError(Exception):
    """The endpoint could not be asked or its answer could not be read."""


@dataclass(frozen=True)
class Credentials:
    """What the control plane gives a trainer for its job's eval endpoints."""

    secrets: Mapping[str, str] = field(default_factory=dict, repr=False)
    """The tenant's secrets the job's config names, by name."""
    endpoints: Mapping[str, Mapping[str, str]] = field(default_factory=dict, repr=False)
    """The operator's endpoints the config names: {"url", "model"?, "api_key"?} by name."""


@dataclass(frozen=True)
class ChatEndpoint:
    """Where a verdict model is served and how to call it."""

    endpoint: str | None
    """Base URL of the OpenAI-compatible API, e.g. http://judge:8000/v1 (no trailing /chat/completions);
    None until bound when the config names an operator endpoint."""
    model: str | None
    """The `model` field sent with each request (an operator endpoint may supply it)."""
    api_key_secret: str | None = None
    """Name of the tenant secret holding the API key (sent as a Bearer token); none sends no key."""
    timeout_s: float = 60.0
    """Seconds one request may take before it counts as failed."""
    endpoint_name: str | None = None
    """An endpoint the operator offers, by name (instead of `endpoint`)."""
    api_key: str | None = field(default=None, repr=False, compare=False)
    """The key itself, once bound."""
    trusted: bool = field(default=False, compare=False)
    """The operator's endpoint: the egress policy for tenants' URLs does not apply."""

    @property
    def url(self) -> str:
        return (self.endpoint or "").rstrip("/") + "/chat/completions"

    @property
    def needs_credentials(self) -> bool:
        return bool(self.api_key_secret or self.endpoint_name)

    def bind(self, credentials: Credentials) -> ChatEndpoint:
        """The endpoint with the operator endpoint's URL and the key filled in from `credentials`."""
        bound = self
        if self.endpoint_name:
            offered = credentials.endpoints.get(self.endpoint_name)
            if not offered or not offered.get("url"):
                raise ChatEndpointError(f"the platform offers no endpoint named {self.endpoint_name!r}")
            bound = dataclasses.replace(bound, endpoint=offered["url"], model=self.model or offered.get("model"),
                                        api_key=offered.get("api_key") or None, trusted=True)
        if self.api_key_secret:
            if self.api_key_secret not in credentials.secrets:
                raise ChatEndpointError(f"the secret {self.api_key_secret!r} no longer exists")
            bound = dataclasses.replace(bound, api_key=credentials.secrets[self.api_key_secret])
        return bound

    @property
    def shown(self) -> str:
        """How errors name it: the tenant's own URL, or the operator endpoint's name (never its URL)."""
        return f"endpoint {self.endpoint_name!r}" if self.endpoint_name else self.url


def parse_endpoint(raw: Mapping[str, Any], param: str, kind: str) -> ChatEndpoint:
    """The endpoint options of a judge or guard config (`param` names the object, e.g.
    eval.metrics[0]); a bad one raises the API error naming its field. The URL's egress check
    is the caller's (services/training/evaluation.py), since it needs the platform's policy."""
    endpoint, name = raw.get("endpoint"), raw.get("endpoint_name")
    if "api_key_env" in raw:
        raise invalid(f"{param}.api_key_env is not supported: store the key as a secret (POST /v1/secrets) "
                      "and name it in api_key_secret", param=f"{param}.api_key_env")
    if (endpoint is None) == (name is None):
        raise invalid(f"{param}: {kind} needs exactly one of \"endpoint\" (an http(s) URL) or \"endpoint_name\" "
                      "(an endpoint the platform offers)", param=f"{param}.endpoint")
    if endpoint is not None and (not isinstance(endpoint, str) or len(endpoint) > _MAX_URL_CHARS
                                 or not endpoint.startswith(("http://", "https://"))):
        raise invalid(f"{param}.endpoint must be the http(s) base URL of an OpenAI-compatible API such as "
                      f"https://judge.example.com/v1", param=f"{param}.endpoint")
    if name is not None and (not isinstance(name, str) or not name.strip() or len(name) > 64):
        raise invalid(f"{param}.endpoint_name must name an endpoint the platform offers",
                      param=f"{param}.endpoint_name")
    model = raw.get("model")
    if model is not None and (not isinstance(model, str) or not model.strip() or len(model) > _MAX_MODEL_CHARS):
        raise invalid(f"{param}.model must be a non-empty string of at most {_MAX_MODEL_CHARS} characters",
                      param=f"{param}.model")
    if model is None and endpoint is not None:
        raise invalid(f"{param}: {kind} needs \"model\" with an endpoint URL", param=f"{param}.model")
    secret = raw.get("api_key_secret")
    if secret is not None and (not isinstance(secret, str) or not secret.strip() or len(secret) > 64):
        raise invalid(f"{param}.api_key_secret must name one of your secrets (GET /v1/secrets)",
                      param=f"{param}.api_key_secret")
    timeout_s = raw.get("timeout_s", 60.0)
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s <= 600:
        raise invalid(f"{param}.timeout_s must be a number of seconds in (0, 600]", param=f"{param}.timeout_s")
    return ChatEndpoint(endpoint, model, secret, float(timeout_s), name)


def open_client(target: ChatEndpoint) -> httpx.Client:
    """A client for `target`: a tenant's URL goes through the egress policy, connect time included
    (TUNEFORGE_EGRESS_ALLOW of the trainer's environment); the operator's endpoints do not."""
    if target.trusted:
        return httpx.Client(trust_env=False, follow_redirects=False, verify=verified_context())
    from tuneforge.security.egress import EgressPolicy
    from tuneforge.settings import Settings

    return EgressPolicy.from_settings(Settings()).client(timeout=target.timeout_s)


def _headers(target: ChatEndpoint) -> dict[str, str]:
    if target.api_key_secret and not target.api_key:
        raise ChatEndpointError(f"the key of {target.shown} (secret {target.api_key_secret!r}) is not available")
    return {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}


@dataclass(frozen=True)
class ChatReply:
    text: str  # the reply's content ("" when the model refused)
    tokens: int  # the endpoint's usage.total_tokens (0 when it reports none)
    refused: bool = False  # the reply is a refusal (message.refusal)
    completion_tokens: int = 0  # of those, the reply's (usage.completion_tokens)


def complete(target: ChatEndpoint, messages: list[dict[str, str]], *, client: httpx.Client | None = None) -> str:
    """The assistant's reply text to `messages`, sampled greedily (temperature 0)."""
    return ask(target, messages, client=client).text


def ask(target: ChatEndpoint, messages: list[dict[str, str]], *, options: Mapping[str, Any] | None = None,
        client: httpx.Client | None = None) -> ChatReply:
    """The reply to `messages` with its token count; `options`: sampling fields of the request
    (temperature — 0 unless given —, top_p, seed, max_completion_tokens)."""
    if not target.endpoint or not target.model:
        raise ChatEndpointError(f"{target.shown} is not bound to a URL and model")
    body = {"model": target.model, "messages": messages, "temperature": 0, **(options or {})}
    headers = _headers(target)
    owned = client is None
    http = client if client is not None else open_client(target)
    try:
        response = http.post(target.url, json=body, headers=headers, timeout=target.timeout_s)
    except httpx.TimeoutException:
        raise ChatEndpointError(f"{target.shown} did not answer within {target.timeout_s:g} s") from None
    except httpx.HTTPError as exc:
        raise ChatEndpointError(f"{target.shown} could not be reached ({_reason(exc)})") from None
    finally:
        if owned:
            http.close()
    if response.status_code >= 300:
        raise ChatEndpointError(f"{target.shown} answered HTTP {response.status_code}")
    return _reply(target, response)


def _reason(exc: httpx.HTTPError) -> str:
    """Our short words for a transport failure (the library's text may quote the remote side)."""
    from tuneforge.security import egress

    if isinstance(exc, egress.EgressDenied):
        return "address not allowed by the egress policy"
    if isinstance(exc, httpx.ConnectError):
        return "connection failed"
    return type(exc).__name__


def _reply(target: ChatEndpoint, response: httpx.Response) -> ChatReply:
    try:
        body = response.json()
        message = body["choices"][0]["message"]
        content = message.get("content")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        raise ChatEndpointError(f"{target.shown} answered HTTP {response.status_code} without "
                                "choices[0].message.content") from None
    usage = body.get("usage") if isinstance(body, dict) else None
    tokens, completion = _count(usage, "total_tokens"), _count(usage, "completion_tokens")
    completion = min(completion, tokens)
    if content is None and isinstance(message.get("refusal"), str):
        return ChatReply("", tokens, refused=True, completion_tokens=completion)
    if not isinstance(content, str):
        raise ChatEndpointError(f"{target.shown} answered a non-text message content")
    return ChatReply(content, tokens, completion_tokens=completion)


def _count(usage: Any, name: str) -> int:
    """A token count of an answer's `usage` (0 where it has none or not a count)."""
    value = usage.get(name) if isinstance(usage, dict) else 0
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**40 else 0
