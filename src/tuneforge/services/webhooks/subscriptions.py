"""Webhooks: tenants' endpoints, the outbox rows of job outcomes, and their signatures.

An outcome is written to the outbox (`webhook_deliveries`) in the same
transaction as the status change, so an event exists exactly when the change
does; `services/webhooks/delivery.py` sends it later, outside that transaction,
so a slow or dead receiver never holds up a job.

Signatures follow Standard Webhooks, the scheme OpenAI's webhooks use:
`webhook-signature: v1,<base64 HMAC-SHA256 of "{webhook-id}.{webhook-timestamp}.{body}">`
keyed with the base64-decoded part of the endpoint's `whsec_...` secret.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy.orm import Session

from tuneforge.db.pagination import Page
from tuneforge.db.repos import webhooks as repo
from tuneforge.db.tables import Job, WebhookDelivery, WebhookEndpoint
from tuneforge.domain.errors import invalid, not_found
from tuneforge.domain.status import JobStatus
from tuneforge.security.crypto import Sealer
from tuneforge.security.egress import EgressPolicy

EVENT_TYPES: dict[JobStatus, str] = {
    JobStatus.SUCCEEDED: "fine_tuning.job.succeeded",
    JobStatus.FAILED: "fine_tuning.job.failed",
    JobStatus.CANCELLED: "fine_tuning.job.cancelled",
}
ALL_EVENTS: tuple[str, ...] = tuple(EVENT_TYPES.values())
SECRET_PREFIX = "whsec_"
SECRET_BYTES = 32
ENDPOINT_DELETED = "the webhook endpoint was deleted"  # the reason its pending deliveries fail with
MAX_ENDPOINTS_PER_TENANT = 20  # each one multiplies every job outcome into another delivery


def is_pending(delivery: WebhookDelivery) -> bool:
    """Whether the delivery is still to be sent (or retried)."""
    return delivery.status == repo.PENDING


class InvalidSignature(ValueError):
    """A webhook request whose headers or signature do not check out."""


# ---- endpoints -------------------------------------------------------------------

def register(session: Session, tenant_id: str, url: Any, events: Iterable[Any] | None = None, *,
             egress: EgressPolicy, sealer: Sealer) -> tuple[WebhookEndpoint, str]:
    """A new endpoint with a fresh signing secret, stored sealed; returns the row and the secret
    (the caller shows it this once). `url` must pass the platform's egress policy."""
    checked_url = egress.check_url(url, param="url")
    event_types = _check_events(events)
    if len(repo.live_endpoints(session, tenant_id)) >= MAX_ENDPOINTS_PER_TENANT:
        raise invalid(f"a tenant can register at most {MAX_ENDPOINTS_PER_TENANT} webhook endpoints; delete one "
                      "first", param="url", code="too_many_webhook_endpoints")
    row = WebhookEndpoint(
        endpoint_id="whep_" + secrets.token_hex(12),
        tenant_id=tenant_id,
        url=checked_url,
        secret=sealer.seal(secret := new_secret()),
        event_types=event_types,
        created_at=int(time.time()),
    )
    session.add(row)
    session.flush()
    return row, secret


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def _check_events(events: Iterable[Any] | None) -> list[str]:
    if events is None:
        return list(ALL_EVENTS)
    wanted = list(events)
    if not wanted:
        raise invalid("events must name at least one event type (omit it to receive all): "
                      + ", ".join(ALL_EVENTS), param="events")
    unknown = [name for name in wanted if name not in ALL_EVENTS]
    if unknown:
        raise invalid(f"unknown event type {unknown[0]!r}; events must be among " + ", ".join(ALL_EVENTS),
                      param="events", code="invalid_event_type")
    return [name for name in ALL_EVENTS if name in wanted]  # one canonical order, no duplicates


def update(session: Session, tenant_id: str, endpoint_id: str, *, egress: EgressPolicy, url: Any = None,
           events: Iterable[Any] | None = None) -> WebhookEndpoint:
    """Change an endpoint's URL and/or event types (None: unchanged); its secret stays. A new
    URL passes the egress policy like a registered one; pending deliveries go to it."""
    row = get(session, tenant_id, endpoint_id)
    if url is not None:
        row.url = egress.check_url(url, param="url")
    if events is not None:
        row.event_types = _check_events(events)
    session.flush()
    return row


def get(session: Session, tenant_id: str, endpoint_id: str) -> WebhookEndpoint:
    row = repo.get_endpoint(session, tenant_id, endpoint_id)
    if row is None:
        raise not_found(f"No such webhook endpoint: {endpoint_id}", param="webhook_id")
    return row


def list_endpoints(session: Session, tenant_id: str, *, after: str | None, limit: int) -> Page:
    return repo.page_endpoints(session, tenant_id, after=after, limit=limit)


def delete(session: Session, tenant_id: str, endpoint_id: str) -> WebhookEndpoint:
    """Nothing more is sent to it; its row stays (disabled) so past deliveries keep their endpoint."""
    row = get(session, tenant_id, endpoint_id)
    row.disabled_at = int(time.time())
    repo.abandon_pending(session, row.endpoint_id, ENDPOINT_DELETED)
    return row


def list_deliveries(session: Session, tenant_id: str, endpoint_id: str, *, after: str | None,
                    limit: int) -> Page:
    row = get(session, tenant_id, endpoint_id)
    return repo.page_deliveries(session, tenant_id, row.endpoint_id, after=after, limit=limit)


# ---- the outbox --------------------------------------------------------------------

def enqueue_job_event(session: Session, job: Job, status: JobStatus) -> list[WebhookDelivery]:
    """One pending delivery per live endpoint of the job's tenant that wants this outcome.

    Called by `services.training.transitions.transition` inside the status change's transaction:
    if that rolls back, so do the deliveries."""
    event_type = EVENT_TYPES.get(JobStatus(status))
    if event_type is None:
        return []
    now = time.time()
    rows = []
    for endpoint in repo.live_endpoints(session, job.tenant_id):
        if event_type not in (endpoint.event_types or []):
            continue
        event_id = "evt_" + secrets.token_hex(16)
        payload = {
            "id": event_id,
            "object": "event",
            "created_at": int(now),
            "type": event_type,
            "data": {"id": job.job_id, "status": job.status, "fine_tuned_model": job.fine_tuned_model,
                     "error": job.error},
        }
        row = WebhookDelivery(delivery_id=event_id, endpoint_id=endpoint.endpoint_id, tenant_id=job.tenant_id,
                              event_type=event_type, payload=payload, status=repo.PENDING, attempts=0,
                              next_attempt_at=now, created_at=int(now))
        session.add(row)
        rows.append(row)
    return rows


# ---- signatures --------------------------------------------------------------------

def encode_body(payload: Mapping[str, Any]) -> bytes:
    """The exact bytes sent and signed."""
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()


def _key(secret: str) -> bytes:
    if not secret.startswith(SECRET_PREFIX):
        raise InvalidSignature(f"a webhook secret starts with {SECRET_PREFIX!r}")
    try:
        return base64.b64decode(secret[len(SECRET_PREFIX):], validate=True)
    except (binascii.Error, ValueError):
        raise InvalidSignature("the webhook secret is not valid base64 after 'whsec_'") from None


def sign(secret: str, event_id: str, timestamp_s: int, body: bytes) -> str:
    """The `webhook-signature` value: `v1,` and the base64 HMAC-SHA256 of `id.timestamp.body`."""
    signed = f"{event_id}.{timestamp_s}.".encode() + body
    digest = hmac.new(_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def signed_headers(secret: str, event_id: str, body: bytes, timestamp_s: int) -> dict[str, str]:
    return {
        "content-type": "application/json",
        "webhook-id": event_id,
        "webhook-timestamp": str(timestamp_s),
        "webhook-signature": sign(secret, event_id, timestamp_s, body),
    }


def verify_signature(secret: str, headers: Mapping[str, str], body: bytes | str, tolerance_s: float = 300,
                     *, now_s: float | None = None) -> dict[str, Any]:
    """Check a received webhook; returns its parsed payload or raises InvalidSignature.

    `headers` is any mapping with `.items()` (names in any case). The timestamp must be
    within `tolerance_s` of now, so a captured request cannot be replayed later."""
    lowered = {str(name).lower(): value for name, value in headers.items()}
    event_id = lowered.get("webhook-id")
    stamp = lowered.get("webhook-timestamp")
    signatures = lowered.get("webhook-signature")
    if not (event_id and stamp and signatures):
        raise InvalidSignature("missing webhook-id, webhook-timestamp or webhook-signature header")
    try:
        timestamp_s = int(stamp)
    except ValueError:
        raise InvalidSignature(f"webhook-timestamp is not unix seconds: {stamp!r}") from None
    now = time.time() if now_s is None else now_s
    if abs(now - timestamp_s) > tolerance_s:
        raise InvalidSignature(f"webhook-timestamp is {now - timestamp_s:.0f} s away from now "
                               f"(tolerance {tolerance_s:g} s)")
    raw = body.encode() if isinstance(body, str) else bytes(body)
    expected = sign(secret, event_id, timestamp_s, raw).partition(",")[2].encode()
    # several space-separated signatures may be sent while a secret is being rotated
    for candidate in signatures.split():
        version, _, value = candidate.partition(",")
        if version == "v1" and hmac.compare_digest(value.encode(), expected):
            return json.loads(raw)
    raise InvalidSignature("no v1 signature in webhook-signature matches the body")
