"""The operators' API (/v1/admin): tenants, API keys, usage across tenants, the queue, spot
reclaims; a fine-tuned model promoted by an admin answers the model object (schemas/models.py)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from tuneforge.api.schemas.base import ApiObject, Number


class Tenant(ApiObject):
    object: Literal["tenant"]
    id: str
    name: str
    tier: str
    pii_policy: str | None
    created_at: int
    quotas: dict[str, Any] = Field(description="The tenant's limits (null: the tier's default).")
    deleted_at: int | None = Field(default=None, description="When the tenant was deleted (its row stays, a "
                                                              "tombstone its billing rows name).")
    api_key: str | None = Field(default=None, description="The first API key: in the answer to the create only.")


class TenantList(ApiObject):
    object: Literal["list"]
    has_more: bool
    data: list[Tenant]


class ApiKey(ApiObject):
    object: Literal["api_key"]
    id: str
    prefix: str
    name: str | None
    created_at: int
    last_used_at: Number | None
    expires_at: Number | None
    revoked_at: Number | None
    active: bool
    api_key: str | None = Field(default=None, description="The secret: in the answer to the create only.")


class ApiKeyList(ApiObject):
    object: Literal["list"]
    has_more: bool
    data: list[ApiKey]


class TenantUsage(ApiObject):
    tenant: str
    tier: str


class AdminUsage(ApiObject):
    object: Literal["list"]
    month: str
    data: list[TenantUsage]


class QueueEntry(ApiObject):
    position: int
    job_id: str
    tenant_id: str
    tier: str
    gpus: int
    queued_at: int
    estimated_start: int | None


class Queue(ApiObject):
    """The whole queue in the order the scheduler would start it."""

    object: Literal["list"]
    data: list[QueueEntry]


class ReclaimedAttempt(ApiObject):
    job_id: str
    attempt: int


class PoolReclaim(ApiObject):
    object: Literal["pool.reclaim"]
    pool: str
    attempts: list[ReclaimedAttempt] = Field(description="The attempts told to checkpoint and stop.")


class AuditEntry(ApiObject):
    object: Literal["audit.entry"]
    id: int = Field(description="The entry's number: entries are numbered in the order they were appended.")
    created_at: float
    actor: str = Field(description="`tenant` (with its key_id), `admin`, or `platform` (the scheduler, trainers).")
    tenant_id: str | None
    key_id: str | None
    action: str = Field(description="The route's name (`create_job`, `delete_file`...) or `job.<status>`.")
    resource_type: str
    resource_id: str | None
    status_code: int | None = Field(description="The answer's HTTP status; null for a change no request made.")
    request_id: str | None = Field(description="The answer's X-Request-Id.")
    summary: dict[str, Any] | None


class AuditList(ApiObject):
    object: Literal["list"]
    has_more: bool
    last_id: int | None = Field(description="Pass as `after` for the next page.")
    data: list[AuditEntry]


class TenantDeletion(ApiObject):
    object: Literal["tenant.deletion"]
    id: str
    name: str
    status: Literal["deleting", "deleted"] = Field(
        description="`deleting`: a trainer of the tenant is still stopping; its data is purged once it has.")
    export_key: str | None = Field(description="The export archive's key in the object store.")
    jobs_cancelled: list[str] = Field(description="Jobs this request cancelled.")
    keys_revoked: int
    objects_deleted: int
    data_keys_erased: int = Field(description="The tenant's data keys erased (envelope encryption): copies of its "
                                              "objects elsewhere can no longer be opened.")
    rows_deleted: dict[str, int] = Field(description="Rows deleted per table (billing and audit rows are kept).")
