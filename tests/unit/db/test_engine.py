from __future__ import annotations

import pytest

from tests.helpers.platform import make_platform
from tuneforge.db.engine import savepoint
from tuneforge.db.tables import Tenant
from tuneforge.services.tenancy import tenants as tenant_service


def _names(platform) -> list[str]:
    with platform.db.session() as session:
        return sorted(t.name for t in session.query(Tenant))


def test_a_savepoint_does_not_commit_the_enclosing_unit_of_work(tmp_path, database_url):
    """On SQLite a savepoint opened before the first write used to start (and, on
    release, commit) the whole transaction: work meant to roll back stayed."""
    platform = make_platform(tmp_path, database_url)
    with pytest.raises(RuntimeError):
        with platform.db.session() as session:
            session.query(Tenant).all()  # reads only: the driver has no transaction open yet
            with savepoint(session):
                tenant_service.create_tenant(session, "inner", "standard")
                session.flush()
            raise RuntimeError("the request fails after the savepoint")
    assert _names(platform) == []

    with platform.db.session() as session:  # and a savepoint that fails rolls back alone
        tenant_service.create_tenant(session, "outer", "standard")
        with pytest.raises(RuntimeError):
            with savepoint(session):
                tenant_service.create_tenant(session, "inner", "standard")
                session.flush()
                raise RuntimeError("the nested part fails")
    assert _names(platform) == ["outer"]
    platform.db.dispose()
