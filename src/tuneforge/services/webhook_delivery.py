"""The webhook dispatcher: a background thread in every control plane that sends due
deliveries from the outbox and retries failed ones with exponential backoff.

A delivery is claimed and committed before its POST (db/repos/webhooks.claim_due),
so no transaction is open while a receiver takes its time, and two control planes
on one database never send the same attempt twice. Delivery is at least once: a
dispatcher that dies after the POST but before recording it leaves the attempt to
be repeated when its claim runs out, so receivers deduplicate on `webhook-id`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx

from tuneforge import __version__
from tuneforge.db.repos import webhooks as repo
from tuneforge.services import webhooks
from tuneforge.services.context import Platform
from tuneforge.settings import Settings

log = logging.getLogger("tuneforge.webhooks")

SENDERS = 4  # deliveries in flight per control plane: one dead receiver does not stall the others
ERROR_SNIPPET_CHARS = 300
USER_AGENT = f"tuneforge-webhooks/{__version__}"


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


class Dispatcher:
    def __init__(self, platform: Platform, *, clock: Callable[[], float] = time.time,
                 client: httpx.Client | None = None) -> None:
        self.platform = platform
        self.clock = clock  # schedules attempts; tests pass a fake one to check the backoff
        self._client = client or httpx.Client(timeout=httpx.Timeout(platform.settings.webhook_timeout_s),
                                              headers={"user-agent": USER_AGENT}, follow_redirects=False)
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
                            endpoints[row.endpoint_id].secret) for row in rows]

    def _attempt(self, item: Claimed) -> None:
        if item.attempt > self.platform.settings.webhook_max_attempts:
            # claimed again after a dispatcher stopped during the last attempt: no attempts are left
            self._record(item, Outcome(None, "no answer was recorded for the last attempt"))
            return
        try:
            outcome = self.send(item)
        except Exception as exc:  # noqa: BLE001 - a bad URL or secret must fail the delivery, not the thread
            outcome = Outcome(None, f"{type(exc).__name__}: {exc}"[:ERROR_SNIPPET_CHARS])
        self._record(item, outcome)

    def send(self, item: Claimed) -> Outcome:
        body = webhooks.encode_body(item.payload)
        # the signed timestamp is wall-clock time whatever self.clock is: receivers check it against theirs
        headers = webhooks.signed_headers(item.secret, item.delivery_id, body, int(time.time()))
        try:
            with self._client.stream("POST", item.url, content=body, headers=headers) as response:
                if 200 <= response.status_code < 300:
                    return Outcome(response.status_code, None)
                snippet = next(response.iter_bytes(ERROR_SNIPPET_CHARS), b"")
        except httpx.TimeoutException as exc:
            return Outcome(None, f"timed out after {self.platform.settings.webhook_timeout_s:g} s "
                                 f"({type(exc).__name__})")
        except httpx.HTTPError as exc:
            return Outcome(None, f"{type(exc).__name__}: {exc}"[:ERROR_SNIPPET_CHARS])
        text = snippet[:ERROR_SNIPPET_CHARS].decode("utf-8", errors="replace").strip()
        return Outcome(response.status_code, f"HTTP {response.status_code}" + (f": {text}" if text else ""))

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
