"""The webhook dispatcher: a background thread in every control plane that sends due
deliveries from the outbox and retries failed ones with exponential backoff.

A delivery is claimed and committed before its POST (db/repos/webhooks.claim_due),
so no transaction is open while a receiver takes its time, and two control planes
on one database never send the same attempt twice. Delivery is at least once: a
dispatcher that dies after the POST but before recording it leaves the attempt to
be repeated when its claim runs out, so receivers deduplicate on `webhook-id`.

Requests go through the egress policy's client (security/egress.py): each connection
is checked again against the address it actually reaches, and redirects are never
followed. What a delivery records is ours alone: the status code and a short reason
from REASONS, never the receiver's body or a network library's message, which could
carry what an internal address answered.
"""

from __future__ import annotations

import logging
import re
import socket
import ssl
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx

from tuneforge import __version__
from tuneforge.db.repos import webhooks as repo
from tuneforge.security.egress import EgressDenied, EgressPolicy
from tuneforge.services.context import Platform
from tuneforge.services.webhooks import subscriptions as webhooks
from tuneforge.settings import Settings

log = logging.getLogger("tuneforge.webhooks")

SENDERS = 4  # deliveries in flight per control plane: one dead receiver does not stall the others
USER_AGENT = f"tuneforge-webhooks/{__version__}"

# every reason a failed attempt may record (besides "HTTP <status>" and "timed out after <n> s")
ADDRESS_NOT_ALLOWED = "address not allowed"
REDIRECT_NOT_FOLLOWED = "redirect not followed"
CONNECTION_REFUSED = "connection refused"
NOT_RESOLVED = "host name did not resolve"
TLS_FAILED = "TLS handshake failed"
CONNECT_FAILED = "connection failed"
CONNECTION_LOST = "connection closed before an answer"
BAD_RESPONSE = "invalid HTTP response"
NOT_SENT = "could not be sent"
NO_ANSWER_RECORDED = "no answer was recorded for the last attempt"
REASONS = frozenset({ADDRESS_NOT_ALLOWED, REDIRECT_NOT_FOLLOWED, CONNECTION_REFUSED, NOT_RESOLVED, TLS_FAILED,
                     CONNECT_FAILED, CONNECTION_LOST, BAD_RESPONSE, NOT_SENT, NO_ANSWER_RECORDED,
                     webhooks.ENDPOINT_DELETED})
_HTTP_STATUS = re.compile(r"HTTP [1-5][0-9][0-9]")
_TIMED_OUT = re.compile(r"timed out after [0-9.]+ s")


@dataclass(frozen=True)
class Claimed:
    delivery_id: str
    attempt: int  # this attempt's number, counted when it was claimed
    payload: dict[str, Any]
    url: str
    secret: str


@dataclass(frozen=True)
class Outcome:
    status_code: int | None
    error: str | None  # None: delivered

    @property
    def delivered(self) -> bool:
        return self.error is None


def backoff_s(attempt: int, settings: Settings) -> float:
    """Wait after failed attempt number `attempt` (1-based): backoff_s, doubling, capped."""
    return min(settings.webhook_backoff_max_s, settings.webhook_backoff_s * 2 ** (attempt - 1))


def claim_lease_s(settings: Settings) -> float:
    """How long a claimed delivery is kept from other dispatchers. The timeout bounds each
    phase of a request (connect, send, each read), not the whole, hence the margin."""
    return 4 * settings.webhook_timeout_s + 30.0


def shown_reason(stored: str | None, status_code: int | None) -> str | None:
    """The reason of a failed attempt as the API shows it: one of ours, as recorded. Rows
    written before reasons were ours may hold a receiver's words ("HTTP 502: <body>") or a
    library's message; only our part of those is shown."""
    if stored is None or stored in REASONS or _HTTP_STATUS.fullmatch(stored) or _TIMED_OUT.fullmatch(stored):
        return stored
    for pattern in (_HTTP_STATUS, _TIMED_OUT):
        found = pattern.match(stored)
        if found:
            return found.group(0)
    return f"HTTP {status_code}" if status_code is not None else CONNECT_FAILED


def _network_reason(exc: httpx.HTTPError) -> str:
    """Our words for a request that got no HTTP answer (the exception's text is never kept)."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    if any(isinstance(item, EgressDenied) for item in chain):
        return ADDRESS_NOT_ALLOWED
    if any(isinstance(item, ConnectionRefusedError) for item in chain):
        return CONNECTION_REFUSED
    if any(isinstance(item, socket.gaierror) for item in chain) or (
            isinstance(exc, httpx.ConnectError) and str(exc).endswith("did not resolve")):
        return NOT_RESOLVED
    if any(isinstance(item, ssl.SSLError) for item in chain):
        return TLS_FAILED
    if isinstance(exc, httpx.ConnectError):
        return CONNECT_FAILED
    if isinstance(exc, (httpx.RemoteProtocolError, httpx.DecodingError)):
        return BAD_RESPONSE
    if isinstance(exc, (httpx.ReadError, httpx.WriteError)):
        return CONNECTION_LOST
    return NOT_SENT


class Dispatcher:
    def __init__(self, platform: Platform, *, clock: Callable[[], float] = time.time,
                 client: httpx.Client | None = None, egress: EgressPolicy | None = None) -> None:
        """`egress`: the policy every send passes (default: the platform settings'); `client`:
        a ready client instead, for tests that need one."""
        self.platform = platform
        self.clock = clock  # schedules attempts; tests pass a fake one to check the backoff
        policy = egress or EgressPolicy.from_settings(platform.settings)
        self._client = client or policy.client(timeout=httpx.Timeout(platform.settings.webhook_timeout_s),
                                               headers={"user-agent": USER_AGENT})
        self._pool = ThreadPoolExecutor(max_workers=SENDERS, thread_name_prefix="tuneforge-webhook-send")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- one pass ---------------------------------------------------------------
    def run_once(self) -> int:
        """Claim up to SENDERS due deliveries, send them concurrently, record each outcome.
        Returns how many were claimed."""
        claimed = self._claim()
        if claimed:
            list(self._pool.map(self._attempt, claimed))
        return len(claimed)

    def _claim(self) -> list[Claimed]:
        now = self.clock()
        with self.platform.db.session() as session:
            rows = repo.claim_due(session, now, now + claim_lease_s(self.platform.settings), SENDERS)
            endpoints = repo.endpoints_by_id(session, {row.endpoint_id for row in rows})
            return [Claimed(row.delivery_id, row.attempts, dict(row.payload), endpoints[row.endpoint_id].url,
                            self.platform.sealer.open(endpoints[row.endpoint_id].secret)) for row in rows]

    def _attempt(self, item: Claimed) -> None:
        if item.attempt > self.platform.settings.webhook_max_attempts:
            # claimed again after a dispatcher stopped during the last attempt: no attempts are left
            self._record(item, Outcome(None, NO_ANSWER_RECORDED))
            return
        try:
            outcome = self.send(item)
        except Exception:
            log.warning("webhook %s could not be sent", item.delivery_id, exc_info=True)
            outcome = Outcome(None, NOT_SENT)
        self._record(item, outcome)

    def send(self, item: Claimed) -> Outcome:
        body = webhooks.encode_body(item.payload)
        # the signed timestamp is wall-clock time whatever self.clock is: receivers check it against theirs
        headers = webhooks.signed_headers(item.secret, item.delivery_id, body, int(time.time()))
        try:
            # the body of the answer is never read: nothing a receiver says is kept or shown
            with self._client.stream("POST", item.url, content=body, headers=headers) as response:
                status = response.status_code
        except httpx.TimeoutException:
            return Outcome(None, f"timed out after {self.platform.settings.webhook_timeout_s:g} s")
        except httpx.HTTPError as exc:
            return Outcome(None, _network_reason(exc))
        if 200 <= status < 300:
            return Outcome(status, None)
        if 300 <= status < 400:
            return Outcome(status, REDIRECT_NOT_FOLLOWED)
        return Outcome(status, f"HTTP {status}")

    def _record(self, item: Claimed, outcome: Outcome) -> None:
        settings = self.platform.settings
        now = self.clock()
        values: dict[str, Any] = {"last_status_code": outcome.status_code, "last_error": outcome.error}
        if outcome.delivered:
            values.update(status=repo.DELIVERED, delivered_at=int(now))
        elif item.attempt >= settings.webhook_max_attempts:
            values.update(status=repo.FAILED)
            log.warning("webhook %s failed after %d attempts: %s", item.delivery_id, item.attempt, outcome.error)
        else:
            values.update(next_attempt_at=now + backoff_s(item.attempt, settings))
        with self.platform.db.session() as session:
            repo.record_attempt(session, item.delivery_id, item.attempt, values)

    # ---- the thread -------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="tuneforge-webhooks", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                busy = self.run_once()
            except Exception:  # e.g. the database briefly away: try again next poll
                log.exception("webhook dispatch failed")
                busy = 0
            if not busy:  # with work left, go straight on to the next batch
                self._stop.wait(self.platform.settings.webhook_poll_s)

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._client.close()
