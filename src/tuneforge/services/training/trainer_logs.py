"""A job's trainer output for its tenant: kept per attempt in the object store, scrubbed, bounded.

The executor captures each trainer's stdout and stderr (a file beside the spec on this host, the
Ray host actor's on a cluster: `Executor.log_tail`). The scheduler copies the newest
`LOG_KEEP_BYTES` of it to `tenants/{t}/jobs/{j}/logs/attempt-{n}.log` while the attempt runs (at
most every `SYNC_INTERVAL_S`) and once more when it has ended, before its executor resources are
released; older output rotates out. What is stored is scrubbed first (`Scrubber`): the platform's
paths (its home, the object store's root and URL, the Ray nodes' folders, the Python installation
and site-packages, temporary folders) become placeholders, and the attempt's job token, API keys,
bearer credentials and the platform's own credentials (S3 keys, the admin key, the sealing key)
become `***`. The tenant reads it with `GET /v1/fine_tuning/jobs/{id}/logs`.
"""

from __future__ import annotations

import hashlib
import os
import re
import site
import sys
import sysconfig
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

import anyio
from sqlalchemy.orm import Session

from tuneforge.db.repos import attempts as attempt_repo
from tuneforge.db.repos import jobs as job_repo
from tuneforge.domain.errors import not_found
from tuneforge.domain.status import TERMINAL, JobStatus
from tuneforge.security.redact import redact_url
from tuneforge.settings import Settings
from tuneforge.storage import layout
from tuneforge.storage.store import ObjectStore

LOG_KEEP_BYTES = 1024 * 1024  # the newest MiB of each attempt's output is kept
SYNC_INTERVAL_S = 2.0
MAX_LINES = 10_000
FOLLOW_POLL_S = 1.0
FOLLOW_MAX_S = 6 * 3600.0  # a follower is let go after this long; it may ask again
_TOKEN_LIKE = re.compile(r"[A-Za-z0-9_-]{43}")  # secrets.token_urlsafe(32), as job tokens are made
_API_KEY = re.compile(r"\btf-[A-Za-z0-9_-]{16,}")
_BEARER = re.compile(r"(?i)(bearer\s+)[^\s'\"]+")
_SITE_PACKAGES = re.compile(r"[^\s'\"(]*[/\\](?:site|dist)-packages(?=[/\\])")
_TMP = re.compile(r"(?<![\w.])/(?:tmp|var/tmp|dev/shm)(?:/[^\s'\":]*)?")


@dataclass(frozen=True)
class Scrubber:
    """Replaces what the platform keeps to itself in a trainer's output."""

    paths: tuple[tuple[str, str], ...]  # (path, placeholder), longest first

    @classmethod
    def from_settings(cls, settings: Settings) -> Scrubber:
        named: dict[str, str] = {}
        store_url = settings.resolved_storage_url
        named[store_url] = "<store>"
        named[redact_url(store_url)] = "<store>"
        if "://" not in store_url:
            named[str(Path(store_url).resolve())] = "<store>"
        home = Path(settings.home)
        named[str(home)] = "<home>"
        named[str(home.resolve())] = "<home>"
        for folder in {sysconfig.get_paths().get("purelib"), sysconfig.get_paths().get("platlib"),
                       *site.getsitepackages(), site.getusersitepackages()}:
            if folder:
                named[folder] = "<site-packages>"
        for folder in {sys.prefix, sys.base_prefix, sys.exec_prefix}:
            named[folder] = "<python>"
        named[tempfile.gettempdir()] = "<tmp>"
        for template in (settings.ray_node_workdir, settings.ray_node_cache_dir):  # the nodes' folders
            stem = os.path.expanduser(template.split("{node_id}")[0])
            named[stem] = "<node>"
        if settings.s3_endpoint_url:
            named[settings.s3_endpoint_url] = "<store-endpoint>"
        # credentials the platform hands its trainers or holds itself, should a trainer print one
        for secret in (settings.s3_secret_access_key, settings.s3_access_key_id, settings.admin_api_key,
                       settings.secrets_key):
            if secret and len(secret) >= 8:
                named[str(secret)] = "***"
        ordered = sorted(((path, label) for path, label in named.items() if len(path) > 1),
                         key=lambda item: -len(item[0]))
        return cls(tuple(ordered))

    def scrub(self, text: str, token_hashes: frozenset[str] = frozenset()) -> str:
        for path, label in self.paths:
            text = text.replace(path, label)
        text = _SITE_PACKAGES.sub("<site-packages>", text)
        text = _TMP.sub("<tmp>", text)
        text = _API_KEY.sub("tf-***", text)
        text = _BEARER.sub(r"\1***", text)
        if token_hashes:
            text = _TOKEN_LIKE.sub(
                lambda m: "***" if hashlib.sha256(m.group(0).encode()).hexdigest() in token_hashes else m.group(0),
                text)
        return text


def keep(store: ObjectStore, scrubber: Scrubber, tail: str, *, tenant_id: str, job_id: str, attempt: int,
         token_hash: str, final: bool) -> None:
    """Store `tail` (the newest output, at most LOG_KEEP_BYTES of it) scrubbed. While the attempt
    runs, only whole lines: a line the trainer is still writing waits for the next copy."""
    if len(tail.encode()) >= LOG_KEEP_BYTES:
        tail = tail.partition("\n")[2]  # the first line was cut by the window
    if not final:
        tail = tail[: tail.rfind("\n") + 1]
    if not tail:
        return
    scrubbed = scrubber.scrub(tail, frozenset({token_hash}))
    store.put_bytes(layout.trainer_log_key(tenant_id, job_id, attempt), scrubbed.encode())


class LogKeeper:
    """The scheduler's side: copies active attempts' output at most every SYNC_INTERVAL_S, and an
    ended attempt's once more (call `final` before its executor resources are released)."""

    def __init__(self, settings: Settings, store: ObjectStore) -> None:
        self.scrubber = Scrubber.from_settings(settings)
        self.store = store
        self._last: dict[tuple[str, int], float] = {}
        self._stored: dict[tuple[str, int], str] = {}  # a digest of what was stored last, per attempt

    def due(self, job_id: str, attempt: int, now: float) -> bool:
        if now - self._last.get((job_id, attempt), 0.0) < SYNC_INTERVAL_S:
            return False
        self._last[(job_id, attempt)] = now
        return True

    def copy(self, tail: str, *, tenant_id: str, job_id: str, attempt: int, token_hash: str, final: bool) -> None:
        """Store the tail unless it is what was stored last (a quiet trainer costs no writes)."""
        digest = hashlib.sha256(f"{final}|{tail}".encode()).hexdigest()
        if self._stored.get((job_id, attempt)) != digest:
            keep(self.store, self.scrubber, tail, tenant_id=tenant_id, job_id=job_id, attempt=attempt,
                 token_hash=token_hash, final=final)
            self._stored[(job_id, attempt)] = digest
        if final:
            self._last.pop((job_id, attempt), None)
            self._stored.pop((job_id, attempt), None)


@dataclass(frozen=True)
class LogView:
    attempt: int
    text: str


def _attempt_of(session: Session, tenant_id: str, job_id: str, attempt: int | None) -> tuple[int, bool]:
    """(the attempt asked for, default the newest; whether the job has ended). 404 for another
    tenant's job and for an attempt the job never had."""
    job = job_repo.get(session, tenant_id, job_id)
    if job is None:
        raise not_found(f"No fine-tuning job found with id '{job_id}'", param="fine_tuning_job_id",
                        code="job_not_found")
    number = job.attempt if attempt is None else attempt
    if attempt is not None and (attempt < 1 or attempt_repo.current(session, tenant_id, job_id, attempt) is None):
        raise not_found(f"Job {job_id} has no attempt {attempt}", param="attempt", code="attempt_not_found")
    return number, JobStatus(job.status) in TERMINAL


def _stored(store: ObjectStore, tenant_id: str, job_id: str, attempt: int) -> str:
    """The attempt's stored log; "" while there is none. The scheduler replaces the object every
    few seconds while the attempt runs: a read that meets a replacement half way (S3 answers
    412 PreconditionFailed when the object changed between its HEAD and its GET) is tried again."""
    if attempt < 1:
        return ""
    key = layout.trainer_log_key(tenant_id, job_id, attempt)
    for tried in range(_READ_TRIES):
        try:
            return store.get_bytes(key).decode("utf-8", "replace")
        except FileNotFoundError:
            return ""
        except OSError:
            if tried == _READ_TRIES - 1:
                raise
            time.sleep(0.2 * (tried + 1))
    return ""


_READ_TRIES = 4


def _bounded(text: str, limit: int, max_bytes: int) -> str:
    lines = text.splitlines(keepends=True)[-limit:]
    kept: list[str] = []
    size = 0
    for line in reversed(lines):
        size += len(line.encode())
        if size > max_bytes:
            break
        kept.append(line)
    return "".join(reversed(kept))


def read(session: Session, store: ObjectStore, tenant_id: str, job_id: str, *, attempt: int | None,
         limit: int, max_bytes: int) -> LogView:
    """The newest `limit` lines (at most `max_bytes`) of the attempt's stored output."""
    number, _ended = _attempt_of(session, tenant_id, job_id, attempt)
    return LogView(number, _bounded(_stored(store, tenant_id, job_id, number), limit, max_bytes))


@dataclass
class Follower:
    """Where a follower is: the attempt it reads and the last lines it sent (how the next copy's new
    lines are found, the window having moved). Unless `pinned` (an attempt was asked for), a newer
    attempt is followed once it starts."""

    tenant_id: str
    job_id: str
    attempt: int
    pinned: bool
    sent: list[str] = field(default_factory=list)
    quiet_since: float | None = None

    def step(self, session: Session, store: ObjectStore, now: float) -> tuple[bytes, bool]:
        """(what to send now, whether the follow is over: the job has ended and no line came for
        longer than the scheduler takes to make its last copy)."""
        newest, ended = _attempt_of(session, self.tenant_id, self.job_id, self.attempt if self.pinned else None)
        chunk = b""
        if newest != self.attempt:
            self.attempt, self.sent = newest, []
            chunk = f"[attempt {newest}]\n".encode()
        fresh = _after(_stored(store, self.tenant_id, self.job_id, self.attempt).splitlines(), self.sent)
        if fresh:
            self.sent, self.quiet_since = (self.sent + fresh)[-3:], None
            return chunk + ("\n".join(fresh) + "\n").encode(), False
        if not ended:
            return chunk, False
        self.quiet_since = now if self.quiet_since is None else self.quiet_since
        return chunk, now - self.quiet_since > 2 * SYNC_INTERVAL_S + 1


async def follow(units: Callable[[], AbstractContextManager[Session]], store: ObjectStore, first: LogView,
                 follower: Follower, *, closing: Callable[[], bool],
                 release: Callable[[], None]) -> AsyncIterator[bytes]:
    """The attempt's output as it grows: what `read` gave, then each new line as the scheduler copies
    it, until the job has ended and its last copy is in, FOLLOW_MAX_S has passed or the server is
    stopping. Waits on the event loop; each look (a row and an object) runs in a thread.
    `units()`: a unit of work (Database.session); `release()`: gives back the follower's stream
    slot once it ends, however it ends (idempotent)."""

    def look() -> tuple[bytes, bool]:
        with units() as session:
            return follower.step(session, store, time.monotonic())

    try:
        yield first.text.encode()
        follower.sent = first.text.splitlines()[-3:]
        started = time.monotonic()
        while time.monotonic() - started < FOLLOW_MAX_S and not closing():
            await anyio.sleep(FOLLOW_POLL_S)
            chunk, over = await anyio.to_thread.run_sync(look)
            if chunk:
                yield chunk
            if over:
                return
    finally:
        release()


def _after(lines: list[str], sent: list[str]) -> list[str]:
    """The lines after the last ones sent; all of them when those rotated out of the kept window."""
    if not sent:
        return lines
    width = len(sent)
    for start in range(len(lines) - width, -1, -1):
        if lines[start:start + width] == sent:
            return lines[start + width:]
    return ["[earlier output rotated out]", *lines] if lines else []
