"""Per-tenant request limits by tier: requests per window, and requests in flight.

`tenant` in api/deps.py admits every authenticated request of a tenant here
(one that carries a body is admitted by api/guard.py instead, before its body
is read, and not counted again), so what needs no tenant key — /healthz, the trainers' /internal routes (job
tokens), the admin API (the admin key), a request that fails authentication —
is never limited. Limits come from TUNEFORGE_RATE_LIMITS, parsed once.

- Rate: a fixed window per tenant, its hits counted in the `limits` storage
  TUNEFORGE_RATE_LIMIT_STORAGE names: this process's memory by default (on
  the event loop: a few dict operations), a SQLite file or PostgreSQL table
  for several processes (db/ratelimit_storage.py; the file is the default
  with several API workers, see `server.worker_app`), or Redis. The SQLite
  file is counted on the event loop too (a local file: ~0.1 ms, less than a
  trip to a thread costs); a storage across the network on a thread of its
  own, never on the event loop. Over it: 429, `Retry-After` = the
  seconds until the window ends. The window is `limits`'s fixed-window
  strategy (a hit is allowed while `storage.incr(key) <= amount`), applied
  here so that one storage call answers both the count and the window's end
  where the storage can (the SQL one: one statement per request).
- In flight: a counter per tenant in this process; with N API workers each
  allows ceil(concurrent / N). Over it: 429, `Retry-After: 1`.

The 429 says so the way OpenAI's API does (`type` "requests", `code`
"rate_limit_exceeded"), so the openai SDK waits Retry-After and retries; an
admitted request's answer carries OpenAI's `x-ratelimit-*-requests` headers.
A storage that fails lets the request through (logged, at most once a
minute): the limiter protects the API, it must not take it down.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import anyio
from limits import RateLimitItem, RateLimitItemPerSecond
from limits.errors import ConfigurationError, StorageError
from limits.storage import MemoryStorage, Storage, storage_from_string

from tuneforge.api.errors import respond
from tuneforge.api.headers import ANSWER_HEADERS
from tuneforge.db.ratelimit_storage import PLATFORM_DATABASE, storage_uri_for_database
from tuneforge.domain.errors import ApiError
from tuneforge.services.tenancy.api_keys import caller_of
from tuneforge.settings import Settings

log = logging.getLogger("tuneforge.ratelimit")

ERROR_TYPE = "requests"  # OpenAI's type for a limit on requests (its "tokens" limits have none here)
RATE_CODE = "rate_limit_exceeded"
CONCURRENCY_CODE = "concurrency_limit_exceeded"
FALLBACK_TIER = "free"  # a tenant whose tier the settings do not know gets the least one's limits, as for quotas
NAMESPACE = "tuneforge"
COUNTER_FILE = "ratelimit.db"
STORAGE_WARNING_INTERVAL_S = 60.0
MAX_REMEMBERED_OVER = 10_000  # tenants over their rate remembered at once (a crude bound, as the key cache's)
# Counting in a storage across the network (PostgreSQL, Redis) runs on threads of its own, never on
# the event loop, and never waits for a thread behind requests that wait for something else.
_STORAGE_THREADS = anyio.CapacityLimiter(32)


def default_storage_uri(settings: Settings, workers: int) -> str:
    """Where request counters live when TUNEFORGE_RATE_LIMIT_STORAGE is unset: this process's memory
    for one API process; for several on this host, a SQLite file they share (HOME/ratelimit.db)."""
    if workers <= 1:
        return "memory://"
    return f"tuneforge+sqlite:///{(settings.home / COUNTER_FILE).resolve()}"


def storage_uri(settings: Settings, workers: int = 1) -> str:
    """The storage URI the API uses: the setting, with 'database' resolved, else the default.
    'database' means the platform's PostgreSQL database; on SQLite, the separate file
    HOME/ratelimit.db, so limiter writes never wait for the platform database's write lock."""
    uri = settings.rate_limit_storage
    if uri is None:
        return default_storage_uri(settings, workers)
    if uri == PLATFORM_DATABASE:
        database_url = settings.resolved_database_url
        if database_url.startswith("sqlite"):
            return f"tuneforge+sqlite:///{(settings.home / COUNTER_FILE).resolve()}"
        return storage_uri_for_database(database_url)
    return uri


@dataclass(frozen=True)
class TierPolicy:
    """One tier's limits as this process applies them."""

    tier: str
    item: RateLimitItem | None  # requests per window; None: no rate limit
    window_s: int
    in_flight: int | None  # this process's share of the tier's `concurrent`; None: unbounded


def tier_policies(settings: Settings, workers: int = 1) -> dict[str, TierPolicy]:
    policies = {}
    for tier, limits in settings.rate_limits.items():
        if limits is None:
            policies[tier] = TierPolicy(tier, None, 1, None)
            continue
        per_window = limits.requests_per_window
        item = RateLimitItemPerSecond(per_window, limits.window_s, namespace=NAMESPACE) if per_window else None
        in_flight = math.ceil(limits.concurrent / max(1, workers)) if limits.concurrent else None
        policies[tier] = TierPolicy(tier, item, limits.window_s, in_flight)
    return policies


class InFlight:
    """Requests of each tenant in flight in this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def try_acquire(self, tenant_id: str, bound: int) -> bool:
        with self._lock:
            count = self._counts.get(tenant_id, 0)
            if count >= bound:
                return False
            self._counts[tenant_id] = count + 1
            return True

    def release(self, tenant_id: str) -> None:
        with self._lock:
            count = self._counts.get(tenant_id, 0) - 1
            if count > 0:
                self._counts[tenant_id] = count
            else:
                self._counts.pop(tenant_id, None)  # idle tenants take no room

    def count(self, tenant_id: str) -> int:
        with self._lock:
            return self._counts.get(tenant_id, 0)


class Admission:
    """One request's hold on a slot of its tenant's in-flight bound; released once, whatever
    happens (api/deps.py releases it when the request is over)."""

    __slots__ = ("_release",)

    def __init__(self) -> None:
        self._release: Callable[[], None] | None = None

    def hold(self, release: Callable[[], None]) -> None:
        self._release = release

    def release(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()


class RequestLimiter:
    """Admits a tenant's requests against its tier's limits; one per API process."""

    def __init__(self, policies: dict[str, TierPolicy], storage: Storage | None,
                 clock: Callable[[], float] = time.time) -> None:
        self.policies = policies
        self.storage = storage
        # memory:// (a few dict operations) and a local SQLite file (~0.1 ms, no network) are counted
        # on the event loop: a trip to a thread would cost more than the count
        self.counts_on_loop = (storage is None or isinstance(storage, MemoryStorage)
                               or getattr(storage, "local_file", False))
        self.in_flight = InFlight()
        self._clock = clock
        errors = storage.base_exceptions if storage is not None else ()
        self._storage_errors = (StorageError, *(errors if isinstance(errors, tuple) else (errors,)))
        self._warned_at = -math.inf
        # tenant id -> (end of its current window, the policy it is over): refused at the door
        # (RefuseWhileOver) until then
        self.over_until: dict[str, tuple[float, TierPolicy]] = {}

    @classmethod
    def from_settings(cls, settings: Settings, workers: int = 1) -> RequestLimiter:
        """The limiter of one of `workers` API processes: counters in the storage the settings name
        (memory:// by default for one process, the shared SQLite file for several)."""
        policies = tier_policies(settings, workers)
        storage = None
        if any(policy.item is not None for policy in policies.values()):
            uri = storage_uri(settings, workers)
            try:
                storage = storage_from_string(uri, wrap_exceptions=True)
            except ConfigurationError as exc:
                raise ValueError(f"TUNEFORGE_RATE_LIMIT_STORAGE {uri!r}: {exc}") from exc
        return cls(policies, storage)

    def policy(self, tier: str) -> TierPolicy | None:
        return self.policies.get(tier) or self.policies.get(FALLBACK_TIER)

    async def admit_request(self, scope: MutableMapping[str, Any], tenant_id: str, tier: str,
                            admission: Admission) -> None:
        """`admit` for a request, from the event loop. The `x-ratelimit-*` headers go into the
        request's scope, where api/headers.py adds them to whatever answers it."""
        policy = self.policy(tier)
        if self.counts_on_loop or policy is None or policy.item is None:
            headers = self.admit(tenant_id, tier, admission)
        else:
            headers = await anyio.to_thread.run_sync(self.admit, tenant_id, tier, admission,
                                                     limiter=_STORAGE_THREADS)
        if headers:
            scope[ANSWER_HEADERS] = headers

    def admit(self, tenant_id: str, tier: str, admission: Admission) -> dict[str, str]:
        """Count one request of the tenant; raises the 429 when it is over a limit. Returns the
        `x-ratelimit-*` headers of its answer (none when the tier has no rate limit)."""
        policy = self.policy(tier)
        if self.over_until:
            self.over_until.pop(tenant_id, None)  # it reached the limiter: the door no longer refuses it
        if policy is None:
            return {}
        if policy.in_flight is not None:
            if not self.in_flight.try_acquire(tenant_id, policy.in_flight):
                raise too_many_in_flight(policy)
            admission.hold(partial(self.in_flight.release, tenant_id))
        if policy.item is None or self.storage is None:
            return {}
        try:
            hits, window_end = self._hit(policy.item, tenant_id)
        except self._storage_errors as exc:
            self._storage_failed(exc)
            return {}
        reset_in_s = max(0.0, window_end - self._clock())
        if hits > policy.item.amount:
            admission.release()
            if len(self.over_until) >= MAX_REMEMBERED_OVER:
                self.over_until.clear()
            self.over_until[tenant_id] = (window_end, policy)
            raise over_rate(policy, reset_in_s)
        return {"x-ratelimit-limit-requests": str(policy.item.amount),
                "x-ratelimit-remaining-requests": str(policy.item.amount - hits),
                "x-ratelimit-reset-requests": duration(reset_in_s)}

    def standing_refusal(self, tenant_id: str, tier: str) -> ApiError | None:
        """The 429 of a tenant already over its rate in a window that has not ended: every request of
        that window would get it (a window's count only grows). None once the window has ended or
        the tenant's tier has changed."""
        held = self.over_until.get(tenant_id)
        if held is None:
            return None
        window_end, policy = held
        reset_in_s = window_end - self._clock()
        if reset_in_s <= 0 or self.policy(tier) is not policy:
            self.over_until.pop(tenant_id, None)
            return None
        return over_rate(policy, reset_in_s)

    def _hit(self, item: RateLimitItem, tenant_id: str) -> tuple[int, float]:
        """One more hit in the tenant's current window: the window's hits, and when it ends."""
        key = item.key_for(tenant_id)
        counted = getattr(self.storage, "incr_with_expiry", None)
        if counted is not None:
            return counted(key, item.get_expiry())
        return self.storage.incr(key, item.get_expiry()), self.storage.get_expiry(key)

    def _storage_failed(self, exc: Exception) -> None:
        now = time.monotonic()
        if now - self._warned_at >= STORAGE_WARNING_INTERVAL_S:
            self._warned_at = now
            log.warning("rate-limit storage failed, requests pass unlimited until it answers: %s", exc)

    def close(self) -> None:
        close = getattr(self.storage, "close", None)
        if close is not None:
            close()


class RefuseWhileOver:
    """ASGI, outside the app: a request of a tenant that is already over its rate in the current
    window gets its 429 here, before routing, dependencies and the exception handlers. Such a
    429 cost the server as much as a cached job read, so that a tenant flooding the API took the
    CPU its neighbours' requests needed (docs/benchmarks-api.md, "A flood from one tenant").
    The caller is known from the API key cache alone (a SHA-256 and a dict lookup); a key the
    cache cannot answer for, and every path that is not a tenant route (`/v1/...` but the admin
    API), go on to the app, which counts, admits or refuses them as before."""

    def __init__(self, app: Any, state: Any) -> None:
        self.app = app
        self.state = state  # the app's state: its rate_limiter and platform, read per request

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        limiter: RequestLimiter = self.state.rate_limiter
        if limiter.over_until and scope["type"] == "http":
            refusal = self._refusal(scope, limiter)
            if refusal is not None:
                await respond(refusal)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _refusal(self, scope: MutableMapping[str, Any], limiter: RequestLimiter) -> ApiError | None:
        path = scope["path"]
        if not path.startswith(TENANT_PATHS) or path.startswith(ADMIN_PATHS):
            return None
        authorization = next((value.decode("latin-1") for name, value in scope["headers"]
                              if name == b"authorization"), None)
        if authorization is None:
            return None
        try:
            columns = self.state.platform.keys.peek(authorization)[1]
        except ApiError:
            return None  # malformed or expired: the app answers it
        if columns is None:
            return None
        caller = caller_of(columns)
        return limiter.standing_refusal(caller.tenant_id, caller.tier)


TENANT_PATHS = "/v1/"
ADMIN_PATHS = "/v1/admin"


def over_rate(policy: TierPolicy, reset_in_s: float) -> ApiError:
    assert policy.item is not None
    window = "second" if policy.window_s == 1 else f"{policy.window_s} seconds"
    return ApiError(
        429, f"Rate limit reached for requests: {policy.item.amount} per {window} for your tier "
             f"({policy.tier}). Please try again in {duration(reset_in_s)}.",
        type=ERROR_TYPE, code=RATE_CODE, retry_after=reset_in_s)


def too_many_in_flight(policy: TierPolicy) -> ApiError:
    return ApiError(
        429, f"Too many requests in flight: at most {policy.in_flight} at once for your tier ({policy.tier}). "
             "Please retry once one of them has been answered.",
        type=ERROR_TYPE, code=CONCURRENCY_CODE, retry_after=1.0)


def duration(seconds: float) -> str:
    """A wait as OpenAI's x-ratelimit-reset-* headers write it: 250ms, 1.5s, 1m0s."""
    milliseconds = max(0, round(seconds * 1000))
    if milliseconds < 1000:
        return f"{milliseconds}ms"
    minutes, rest = divmod(seconds, 60)
    text = f"{rest:.3f}".rstrip("0").rstrip(".") + "s"
    return f"{int(minutes)}m{text}" if minutes else text
