"""Tenant secrets: credentials a tenant stores for the platform to use on its behalf.

A job config never carries a credential and never names an environment
variable: it names a secret (`"api_key_secret": "JUDGE_KEY"`), and the trainer
of that job asks the control plane for the values its config names
(`values_for_job`), once per attempt, authenticated by its job token.
Values are sealed at rest (security/crypto.py) and shown to nobody: the API
lists names and dates only.
"""

from __future__ import annotations

import re
import time

from sqlalchemy.orm import Session

from tuneforge.db.repos import secrets as repo
from tuneforge.db.repos import webhooks as webhook_repo
from tuneforge.db.tables import TenantSecret
from tuneforge.domain.errors import invalid, not_found
from tuneforge.security.crypto import Sealer

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
_NAME = re.compile(NAME_PATTERN)
MAX_VALUE_CHARS = 8192
MAX_SECRETS_PER_TENANT = 100


def check_name(name: str, param: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise invalid(f"{param} must be a secret name: 1-64 characters of A-Z, a-z, 0-9, '_', '.' or '-', "
                      "starting with a letter or digit", param=param, code="invalid_secret_name")
    return name


def put(session: Session, sealer: Sealer, tenant_id: str, name: str, value: str) -> tuple[TenantSecret, bool]:
    """Store `value` under `name` (a new secret, or a new value for an existing one: rotation);
    returns the row and whether it is new."""
    check_name(name, "name")
    if not isinstance(value, str) or not value or len(value) > MAX_VALUE_CHARS:
        raise invalid(f"value must be a non-empty string of at most {MAX_VALUE_CHARS} characters",
                      param="value", code="invalid_secret_value")
    now = int(time.time())
    existing = repo.get(session, tenant_id, name)
    if existing is not None:
        existing.value, existing.updated_at = sealer.seal(value), now
        return existing, False
    if repo.count_locked(session, tenant_id) >= MAX_SECRETS_PER_TENANT:
        raise invalid(f"a tenant can store at most {MAX_SECRETS_PER_TENANT} secrets; delete one first",
                      param="name", code="too_many_secrets")
    row = TenantSecret(tenant_id=tenant_id, name=name, value=sealer.seal(value), created_at=now, updated_at=now)
    session.add(row)
    session.flush()
    return row, True


def list_names(session: Session, tenant_id: str) -> list[TenantSecret]:
    return repo.of_tenant(session, tenant_id)


def delete(session: Session, tenant_id: str, name: str) -> TenantSecret:
    row = repo.get(session, tenant_id, name)
    if row is None:
        raise not_found(f"No such secret: {name}", param="name")
    session.delete(row)
    return row


def require(session: Session, tenant_id: str, name: str, param: str) -> None:
    """At job creation: the secret a config names exists (400 naming the field otherwise)."""
    check_name(name, param)
    if repo.get(session, tenant_id, name) is None:
        raise invalid(f"{param}: no secret named {name!r}; store it first with POST /v1/secrets",
                      param=param, code="secret_not_found")


def values(session: Session, sealer: Sealer, tenant_id: str, names: set[str]) -> dict[str, str]:
    """The plain values of the tenant's secrets among `names` (for its own trainer only)."""
    return {row.name: sealer.open(row.value) for row in repo.named(session, tenant_id, names)}


def rotate(session: Session, sealer: Sealer) -> int:
    """Re-seal every stored secret (tenant secrets and webhook signing secrets) under the newest
    key; values stored before encryption get sealed. Returns how many values were written."""
    count = 0
    for row in repo.all_rows(session):
        row.value = sealer.reseal(row.value)
        count += 1
    for endpoint in webhook_repo.all_endpoints(session):
        endpoint.secret = sealer.reseal(endpoint.secret)
        count += 1
    for data_key in repo.data_keys(session):  # tenants' data keys (services/tenancy/data_keys.py)
        assert data_key.sealed is not None
        data_key.sealed = sealer.reseal(data_key.sealed)
        count += 1
    return count
