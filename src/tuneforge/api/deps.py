"""Request dependencies: the platform, a database session, the calling tenant, the egress policy."""

from __future__ import annotations

from collections.abc import Iterator

from fastapi import Depends, Header, Request
from sqlalchemy.orm import Session

from tuneforge.db.tables import Tenant
from tuneforge.security.egress import EgressPolicy
from tuneforge.services import tenants as tenant_service
from tuneforge.services.context import Platform


def platform(request: Request) -> Platform:
    return request.app.state.platform


def egress(request: Request) -> EgressPolicy:
    """The policy every tenant-supplied URL passes (TUNEFORGE_EGRESS_ALLOW widens it)."""
    return EgressPolicy.from_settings(request.app.state.platform.settings)


EGRESS = Depends(egress)


def session(request: Request) -> Iterator[Session]:
    with request.app.state.platform.db.session() as db_session:
        yield db_session


# The session's unit of work ends (commit) before the response goes out: a
# client that was answered 200 can rely on the write being stored, even if
# this process dies right after answering (the default "request" scope would
# commit after the response has been sent).
SESSION = Depends(session, scope="function")


def tenant(
    authorization: str | None = Header(default=None),
    db_session: Session = SESSION,
) -> Tenant:
    return tenant_service.authenticate(db_session, authorization)
