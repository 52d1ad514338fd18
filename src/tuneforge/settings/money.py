"""Settings of what a tenant may store and how often it may ask for estimates: the storage
quotas by tier and the estimate bounds. Part of `tuneforge.settings.Settings` (read from
`TUNEFORGE_*` like the rest); `services/tenancy/quotas.py` applies them."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

GIB = 1024 ** 3


class StorageQuota(BaseModel):
    """What one tenant of a tier may keep in the object store; null lifts a limit."""

    model_config = ConfigDict(extra="forbid")

    file_bytes: int | None = Field(
        default=None, ge=0, description="Bytes of the tenant's files (every purpose, results included) at once.")
    pending_upload_bytes: int | None = Field(
        default=None, ge=0, description="Bytes declared (`bytes` at POST /v1/uploads) by its pending uploads, "
                                        "added up.")
    pending_uploads: int | None = Field(
        default=None, ge=0, description="Pending (neither completed, cancelled nor expired) uploads at once.")
    artifact_bytes: int | None = Field(
        default=None, ge=0, description="Bytes of its jobs' checkpoints and final artifacts; past it a new job "
                                        "is refused until some are deleted.")


# Free holds about 4 of its largest files (256 MiB each) and a few small models' checkpoints;
# standard and premium scale with their upload limits (2 GiB, 8 GiB per file).
DEFAULT_STORAGE_QUOTAS: dict[str, dict[str, int | None]] = {
    "free": {"file_bytes": 1 * GIB, "pending_upload_bytes": 1 * GIB, "pending_uploads": 10,
             "artifact_bytes": 20 * GIB},
    "standard": {"file_bytes": 50 * GIB, "pending_upload_bytes": 50 * GIB, "pending_uploads": 50,
                 "artifact_bytes": 500 * GIB},
    "premium": {"file_bytes": 1000 * GIB, "pending_upload_bytes": 500 * GIB, "pending_uploads": 100,
                "artifact_bytes": 10000 * GIB},
}


class MoneySettings(BaseModel):
    storage_quotas: dict[str, StorageQuota] = Field(
        default_factory=lambda: {tier: StorageQuota(**quota) for tier, quota in DEFAULT_STORAGE_QUOTAS.items()},
        description='Storage quotas per tenant, by tier (JSON): file_bytes, pending_upload_bytes, pending_uploads, '
                    'artifact_bytes, e.g. {"free": {"file_bytes": 2147483648}}. A tier or field not given keeps '
                    'its default (free: 1 GiB of files, 1 GiB declared by at most 10 pending uploads, 20 GiB of '
                    'artifacts; standard 50 GiB/50 GiB/50/500 GiB; premium 1000 GiB/500 GiB/100/10000 GiB); '
                    'null lifts a limit. docs/quotas-and-usage.md, "Storage".')
    estimate_cache_entries: int = Field(
        default=256, ge=0, description="Job estimates kept per API process, keyed by the request's content (files' "
                                       "SHA-256 and the resolved configuration); 0 caches none.")
    estimates_per_minute: int = Field(
        default=10, ge=1, description="Estimates one tenant may have computed per minute (cached answers are "
                                      "free); past it, 429 with Retry-After. At most one per tenant runs at once.")

    @field_validator("storage_quotas", mode="before")
    @classmethod
    def _storage_quotas_over_defaults(cls, value: object) -> object:
        """Every tier gets its quotas: the fields a tier names replace its defaults, the rest stay."""
        if not isinstance(value, dict):
            return value
        unknown = sorted(str(tier) for tier in value if tier not in DEFAULT_STORAGE_QUOTAS)
        if unknown:
            raise ValueError(f"TUNEFORGE_STORAGE_QUOTAS names unknown tier(s) {', '.join(unknown)}; the tiers are "
                             f"{', '.join(DEFAULT_STORAGE_QUOTAS)}")
        merged: dict[str, object] = {}
        for tier, defaults in DEFAULT_STORAGE_QUOTAS.items():
            given = value.get(tier, {})
            merged[tier] = {**defaults, **given} if isinstance(given, dict) else given
        return merged

    def storage_quota(self, tier: str) -> StorageQuota:
        """The tier's quota; an unknown tier gets the free tier's, the least a tenant can have."""
        return self.storage_quotas.get(tier) or self.storage_quotas["free"]
