"""Request dependencies: the platform, a database session, the calling tenant (admitted by its
tier's rate limits), the egress policy.

They are async on purpose: every sync dependency costs a hop through the thread pool, and under
load those hops, not the queries, were most of a request's CPU. A request's database work runs
in the endpoint's thread (sync endpoints) or in a thread it asks for; the dependencies here
only open and close sessions and read the API key cache."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import anyio
import orjson
from fastapi import Depends, Header, Request, Response
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from tuneforge.api.keys import verify_columns
from tuneforge.api.ratelimits import Admission, RequestLimiter
from tuneforge.db.tables import Tenant
from tuneforge.security.egress import EgressPolicy
from tuneforge.services.context import Platform
from tuneforge.services.tenancy.api_keys import Caller, caller_of, tenant_of

log = logging.getLogger(__name__)
T = TypeVar("T")
_READS = frozenset({"GET", "HEAD"})


def platform(request: Request) -> Platform:
    return request.app.state.platform


def egress(request: Request) -> EgressPolicy:
    """The policy every tenant-supplied URL passes (TUNEFORGE_EGRESS_ALLOW widens it), resolving
    hosts with the app's `egress_resolver` (None: the system's)."""
    return EgressPolicy.from_settings(request.app.state.platform.settings,
                                      resolver=getattr(request.app.state, "egress_resolver", None))


EGRESS = Depends(egress)


def _finish(db_session: Session, ok: bool) -> None:
    try:
        if ok:
            db_session.commit()
        else:
            db_session.rollback()
    finally:
        db_session.close()


# Ending a unit of work must never wait for a thread behind requests that wait for the locks it
# holds: with one pool, 40 creates waiting for SQLite's write lock would leave no thread to
# commit (or roll back) the transaction holding it. So endings have threads of their own.
_ENDINGS = anyio.CapacityLimiter(64)


async def session(request: Request) -> AsyncIterator[Session]:
    db_session = request.app.state.platform.db.new_session()
    # A read's commit ends a read-only transaction: quick enough to do here. A write's commit may
    # wait (fsync, a PostgreSQL round trip): it runs in a thread so the event loop never waits on it.
    inline = request.method in _READS
    ok = False
    try:
        yield db_session
        ok = True
    finally:
        if inline:
            _finish(db_session, ok)
        else:
            await anyio.to_thread.run_sync(_finish, db_session, ok, limiter=_ENDINGS)


# The session's unit of work ends (commit) before the response goes out: a
# client that was answered 200 can rely on the write being stored, even if
# this process dies right after answering (the default "request" scope would
# commit after the response has been sent).
SESSION = Depends(session, scope="function")


def verify_key(platform: Platform, authorization: str | None) -> Tenant:
    """The key looked up in the database (and remembered), for a caller outside the event loop."""
    return tenant_of(verify_columns(platform, authorization))


async def admission() -> AsyncIterator[Admission]:
    """The request's slot among its tenant's requests in flight, released when the request is over:
    answered (a streamed answer once its last byte is sent), failed, or abandoned by its client."""
    held = Admission()
    try:
        yield held
    finally:
        held.release()


# Set in a request's scope by the edge (api/guard.py) once it has admitted the request, before
# reading its body: the dependencies below then do not count it again.
ADMITTED_AT_EDGE = "tuneforge.admitted_at_edge"


async def tenant(request: Request, authorization: str | None = Header(default=None),
                 slot: Admission = Depends(admission)) -> Tenant:
    """The calling tenant, admitted by its tier's rate limits (api/ratelimits.py): 401 without a
    valid key, 429 over a limit."""
    found = tenant_of(await request.app.state.key_lookups.columns(authorization))
    if not request.scope.get(ADMITTED_AT_EDGE):
        await _admit(request, found.tenant_id, found.tier, slot)
    return found


async def _admit(request: Request, tenant_id: str, tier: str, slot: Admission) -> None:
    limiter: RequestLimiter = request.app.state.rate_limiter
    await limiter.admit_request(request.scope, tenant_id, tier, slot)


_OPTIONAL_STRING = {"anyOf": [{"type": "string"}, {"type": "null"}]}


def lean_parameters(*path_params: str) -> dict[str, Any]:
    """`openapi_extra` of a lean route: the parameters its function does not declare (it reads them
    from the request itself; FastAPI's parameter solving costs more CPU than such a route's database
    read), as FastAPI would have documented them: the path's, then the Authorization header (by
    which api/openapi.py knows the operation takes a key)."""
    parameters = [{"name": name, "in": "path", "required": True,
                   "schema": {"type": "string", "title": name.replace("_", " ").title()}} for name in path_params]
    parameters.append({"name": "authorization", "in": "header", "required": False,
                       "schema": {**_OPTIONAL_STRING, "title": "Authorization"}})
    return {"parameters": parameters}


@asynccontextmanager
async def admitted(request: Request) -> AsyncIterator[Caller]:
    """`tenant` for the lean routes (the most polled ones), without FastAPI's dependency machinery:
    solving the TENANT dependency tree cost more CPU than the route's database read. The caller is
    the tenant's id and tier (no Tenant object), admitted by the tier's rate limits; its slot among
    the tenant's requests in flight is released when the block ends."""
    async with admitted_caller(request.app.state, request.scope, request.headers.get("authorization")) as found:
        yield found


@asynccontextmanager
async def admitted_caller(state: Any, scope: Any, authorization: str | None) -> AsyncIterator[Caller]:
    """`admitted`, from the app's `state` and the request's ASGI `scope` (api/hot_path.py answers
    before there is a Request)."""
    found = caller_of(await state.key_lookups.columns(authorization))
    slot = Admission()
    limiter: RequestLimiter = state.rate_limiter
    try:
        if not scope.get(ADMITTED_AT_EDGE):
            await limiter.admit_request(scope, found.tenant_id, found.tier, slot)
        yield found
    finally:
        slot.release()


TENANT = Depends(tenant)


async def in_unit_of_work(request: Request, work: Callable[..., T], *args: Any) -> T:
    """`work(session, *args)` in one unit of work, in one trip through the thread pool: the lean
    path of the busiest routes (a sync endpoint with the SESSION dependency costs three trips and
    an exit stack). Commits when `work` returns, rolls back when it raises."""
    db = request.app.state.platform.db

    def run() -> T:
        with db.session() as db_session:
            return work(db_session, *args)

    if request.method in _READS and db.dialect == "sqlite":
        return run()  # a read of SQLite: right here, as db/fastread.Reads explains
    return await run_in_threadpool(run)


def json_response(body: Any, status_code: int = 200) -> Response:
    """The answer as JSON, encoded once by orjson (no response-model pass)."""
    return Response(orjson.dumps(body), status_code=status_code, media_type="application/json")
