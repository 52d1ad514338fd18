"""/v1/secrets — credentials a tenant stores for its jobs (e.g. its LLM judge's API key).

Not part of OpenAI's API. A value goes in once and never comes out: listing shows
names and dates only. Eval configs reference a secret by name (`api_key_secret`).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Path
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from tuneforge.api import deps
from tuneforge.api.schemas.base import ObjectRoute
from tuneforge.api.schemas.secrets import Secret, SecretDeleted, SecretList
from tuneforge.db import Session
from tuneforge.db.tables import Tenant, TenantSecret
from tuneforge.services.context import Platform
from tuneforge.services.tenancy import secrets as secret_service

router = APIRouter(prefix="/v1/secrets", tags=["secrets"], route_class=ObjectRoute)
TENANT = Depends(deps.tenant)


class SecretPut(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=64, pattern=secret_service.NAME_PATTERN,
                      description="the name job configs use to reference it, e.g. JUDGE_API_KEY")
    value: str = Field(min_length=1, max_length=secret_service.MAX_VALUE_CHARS,
                       description="the secret; stored sealed, never shown again")


def secret_object(row: TenantSecret) -> dict[str, Any]:
    return {"object": "secret", "name": row.name, "created_at": row.created_at, "updated_at": row.updated_at}


@router.post("", status_code=201, response_model=Secret,
             responses={200: {"model": Secret, "description": "an existing secret got the new value"}})
def put_secret(body: SecretPut, tenant: Tenant = TENANT, session: Session = deps.SESSION,
               platform: Platform = Depends(deps.platform)) -> Any:
    """Store a secret; a name that exists gets the new value (rotation)."""
    row, created = secret_service.put(session, platform.sealer, tenant.tenant_id, body.name, body.value)
    return JSONResponse(secret_object(row), status_code=201 if created else 200)


@router.get("", response_model=SecretList)
def list_secrets(tenant: Tenant = TENANT, session: Session = deps.SESSION) -> dict:
    rows = secret_service.list_names(session, tenant.tenant_id)
    return {"object": "list", "data": [secret_object(row) for row in rows], "has_more": False}


@router.delete("/{name}", response_model=SecretDeleted)
def delete_secret(name: str = Path(max_length=64), tenant: Tenant = TENANT,
                  session: Session = deps.SESSION) -> dict:
    row = secret_service.delete(session, tenant.tenant_id, name)
    return {"object": "secret", "name": row.name, "deleted": True}
