"""Who may send a body: the caller's credentials, checked from the headers alone before a byte of
the body is read (api/guard.py).

Without this the edge read, parsed and spooled whatever came before the route looked at the key:
an anonymous 16 MiB JSON array froze a worker for tens of seconds, an anonymous upload went to
disk before its 401. Now what an unauthenticated request costs is a header check (and for a key
or job token the cache has not seen, one database look-up in a thread).

Each path has an audience, read from its prefix:

- `/v1/admin...`: the operator, by TUNEFORGE_ADMIN_API_KEY (404 while the admin API is off);
- every other `/v1/...`: a tenant, by its API key (the same look-up, cache and 401 as the routes');
- `/internal/v1/jobs/{job_id}/...`: a trainer, by a job token that some attempt of that job holds;
- anything else (health, the console, the API reference): public, and takes no body, so the
  edge never reads one for it.
"""

from __future__ import annotations

import hmac
import logging
import re
from collections.abc import MutableMapping
from typing import Any, Literal

from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as SQLAlchemyTimeoutError

from tuneforge.api.errors import is_busy
from tuneforge.domain.errors import ApiError, unauthorized
from tuneforge.services.tenancy.api_keys import Caller, caller_of
from tuneforge.settings import Settings

log = logging.getLogger(__name__)

Audience = Literal["public", "tenant", "admin", "trainer"]
ADMIN_PREFIX = "/v1/admin"
TENANT_PREFIX = "/v1/"
TRAINER_PREFIX = "/internal/"
# the training API (Tinker's wire): its SDK sends the tenant's key as `X-API-Key: tml-<key>`
TRAINING_API_PREFIX = "/tinker/"
TRAINING_API_KEY_PREFIX = "tml-"
_POOL_PATH = re.compile(r"^/internal/v1/pools/([^/]+)/")
_POOL_JOB_PATH = re.compile(r"^/internal/v1/pools/jobs/([^/]+)/")  # an ordinary job's steps on a shared pool
_TRAINER_PATH = re.compile(r"^/internal/v1/jobs/([^/]+)/")
# Retry-After of the 503 when the database was too busy to check a credential
CHECK_FAILED_RETRY_AFTER_S = 1.0


def audience(path: str) -> Audience:
    if path == ADMIN_PREFIX or path.startswith(ADMIN_PREFIX + "/"):
        return "admin"
    if path.startswith(TENANT_PREFIX) or path.startswith(TRAINING_API_PREFIX):
        return "tenant"
    if path.startswith(TRAINER_PREFIX):
        return "trainer"
    return "public"


def authorization_of(scope: MutableMapping[str, Any]) -> str | None:
    """The request's credentials as an Authorization header's value. On the training API, whose SDK
    sends `X-API-Key: tml-<key>`, that key (its `tml-` dropped) as a bearer token."""
    headers = scope.get("headers", ())
    for name, value in headers:
        if name.lower() == b"authorization":
            return value.decode("latin-1")
    if scope.get("path", "").startswith(TRAINING_API_PREFIX):
        return training_api_authorization(headers)
    return None


def training_api_authorization(headers: Any) -> str | None:
    for name, value in headers:
        if name.lower() == b"x-api-key":
            key = value.decode("latin-1").strip()
            return f"Bearer {key[len(TRAINING_API_KEY_PREFIX):] if key.startswith(TRAINING_API_KEY_PREFIX) else key}"
    return None


def admin_refusal(settings: Settings, authorization: str | None) -> ApiError | None:
    """The admin API's answer to a caller without the admin key: 404 while the API is off, 401
    for a wrong key; None for the operator. The comparison takes the same time whatever it meets."""
    expected = settings.admin_api_key
    if not expected:
        return ApiError(404, "the admin API is off (set TUNEFORGE_ADMIN_API_KEY)", code="not_found")
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), expected.encode()):
        return unauthorized("invalid admin API key")
    return None


async def check(scope: MutableMapping[str, Any], who: Audience) -> Caller | None:
    """Raises the ApiError a caller of `who` without valid credentials gets (401, or 404 for the
    admin API while it is off); answers the tenant's Caller for a tenant route, else None."""
    state = scope["app"].state
    authorization = authorization_of(scope)
    try:
        if who == "tenant":
            return caller_of(await state.key_lookups.columns(authorization))
        if who == "admin":
            refusal = admin_refusal(state.platform.settings, authorization)
            if refusal is not None:
                raise refusal
            return None
        if who == "trainer":
            pool_job = _POOL_JOB_PATH.match(scope["path"])
            if pool_job is not None:  # any attempt's token of that job; the route then asks for the current one
                await state.trainer_tokens.check(pool_job.group(1), authorization)
                return None
            pool = _POOL_PATH.match(scope["path"])
            if pool is not None:
                if state.platform.settings.training_api_upstream:
                    return None  # forwarded to the process holding the pools, which checks it before reading
                scheme, _, token = (authorization or "").partition(" ")
                await state.training_api.pool(pool.group(1), token.strip())
                return None
            match = _TRAINER_PATH.match(scope["path"])
            if match is None:
                raise unauthorized("invalid job token", code="invalid_job_token")
            await state.trainer_tokens.check(match.group(1), authorization)
        return None
    except (OperationalError, SQLAlchemyTimeoutError) as exc:
        if not is_busy(exc):
            raise  # the app's handler of unexpected errors logs it under a request id (500)
        # the database was too busy to say: the body of a caller nobody vouched for is not read
        log.warning("could not check the credentials of %s %s: %r", scope["method"], scope["path"], exc)
        raise ApiError(503, "The service is busy; nothing was changed. Retry in a moment.",
                       type="server_error", code="server_busy", retry_after=CHECK_FAILED_RETRY_AFTER_S) from None
