"""The object proxy's use case (api/routes/objects.py): which attempt a job token speaks for, and
which objects that attempt may reach (storage/access.py), decided before any body is read.

Only the current attempt of a running (or evaluating) job gets an answer: a token of an earlier
attempt is fenced with 409 `stale_attempt` like its reports, an unknown one is 401. The scope is
built from the same rows the attempt's JobSpec was built from (scheduler/spec_builder.py).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from sqlalchemy.orm import Session

from tuneforge.db.repos import attempts as attempt_repo
from tuneforge.db.repos import base_models as base_model_repo
from tuneforge.db.repos import files as file_repo
from tuneforge.db.tables import Job
from tuneforge.domain.errors import ApiError, unauthorized
from tuneforge.services.training.reports import require_current, token_hash
from tuneforge.storage.access import KeyRefused, ObjectScope, job_scope

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Grant:
    """What one attempt's token opens."""

    job_id: str
    tenant_id: str
    attempt: int
    scope: ObjectScope


def out_of_scope(grant: Grant, operation: str, key: str) -> ApiError:
    """The 403 a key outside the attempt's scope gets; logged, since a trainer asking for one is
    either a bug or tenant code probing."""
    log.warning("object proxy refused %s %r to %s attempt %d (tenant %s): outside its scope",
                operation, key[:300], grant.job_id, grant.attempt, grant.tenant_id)
    return ApiError(403, f"{operation} of this object is outside what job {grant.job_id} may reach",
                    "invalid_request_error", "key", "object_out_of_scope")


def check_key(grant: Grant, operation: str, key: str, *, write: bool) -> str:
    """`key` cleaned, if the attempt may `operation` it; else the 403 (or 400 for a non-key)."""
    try:
        allowed = grant.scope.may_write(key) if write else grant.scope.may_read(key)
    except KeyRefused as exc:
        raise ApiError(400, str(exc), "invalid_request_error", "key", "invalid_object_key") from None
    if not allowed:
        raise out_of_scope(grant, operation, key)
    return key.strip("/")


def check_prefix(grant: Grant, prefix: str) -> str:
    try:
        allowed = grant.scope.may_list(prefix)
    except KeyRefused as exc:
        raise ApiError(400, str(exc), "invalid_request_error", "prefix", "invalid_object_key") from None
    if not allowed:
        raise out_of_scope(grant, "listing", prefix)
    return prefix.strip("/")


def grant_for(session: Session, job_id: str, authorization: str | None) -> Grant:
    """The grant of the attempt whose token `authorization` carries, if it is `job_id`'s current one."""
    token = (authorization or "").partition(" ")[2].strip()
    found = attempt_repo.holding_token(session, job_id, token_hash(token)) if token else None
    if found is None:
        raise unauthorized("invalid job token", code="invalid_job_token")
    job, attempt = found
    require_current(job, attempt)
    return Grant(job.job_id, job.tenant_id, attempt.number, scope_of(session, job))


def scope_of(session: Session, job: Job) -> ObjectScope:
    """The objects an attempt of `job` may reach: its JobSpec's keys (scheduler/spec_builder.py)."""
    resolved = job.resolved
    data: list[str] = []
    models: list[str] = []
    if resolved is not None:
        data += [resolved.data.train_key or "", resolved.data.valid_key or ""]
        if resolved.eval is not None and resolved.eval.enabled:
            data.append(resolved.eval.task_file_key or "")
    if job.training_file:
        training = file_repo.get(session, job.tenant_id, job.training_file)
        if training is not None and not (resolved is not None and resolved.data.train_key):
            data.append(training.key)
    base = base_model_repo.by_name(session, job.model)
    if base is not None:
        models.append(base.prefix)
    parent = job.parent or {}
    models += [str(parent.get("model_prefix") or ""), str(parent.get("adapter_prefix") or "")]
    return job_scope(job.tenant_id, job.job_id, data_keys=data, model_prefixes=models)


class Grants:
    """Grants remembered for `ttl_s`, so that the hundred files of a checkpoint cost one look-up:
    an attempt that ends keeps its reach for at most that long."""

    ttl_s = 5.0
    max_entries = 4096

    def __init__(self, db: object) -> None:
        self._db = db
        self._lock = threading.Lock()
        self._known: dict[tuple[str, str], tuple[float, Grant]] = {}

    def get(self, job_id: str, authorization: str | None) -> Grant:
        """Blocking (a database look-up): call it in a thread."""
        key = (job_id, token_hash((authorization or "").partition(" ")[2].strip()))
        now = time.monotonic()
        with self._lock:
            known = self._known.get(key)
        if known is not None and known[0] > now:
            return known[1]
        with self._db.session() as session:  # type: ignore[attr-defined]
            grant = grant_for(session, job_id, authorization)
        with self._lock:
            if len(self._known) >= self.max_entries:
                self._known.clear()
            self._known[key] = (now + self.ttl_s, grant)
        return grant
