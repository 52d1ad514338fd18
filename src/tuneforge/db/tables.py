"""Tables of the metadata store (SQLAlchemy 2 declarative).

Every row has an integer `pk` (insertion order: list ordering and cursors) and,
where the API shows it, a public string id. Timestamps the API shows are unix
seconds (OpenAI's convention); lease timestamps are float seconds.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    DDL,
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    event,
    false,
    true,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

from tuneforge.domain.job_config import JobRequest
from tuneforge.domain.resolved import ResolvedJob


class TypedJSON(TypeDecorator):
    """A JSON column holding one typed value of `value_type`: written with the value's
    `to_json()`, read with `value_type.from_json(...)`. The database keeps plain JSON (the
    column's schema is unchanged); Python code sees only the typed value, and assigning
    anything else (a dict) fails at the flush."""

    impl = JSON
    cache_ok = True

    def __init__(self, value_type: type) -> None:
        super().__init__()
        self.value_type = value_type

    def process_bind_param(self, value: Any, dialect: Dialect) -> dict[str, Any] | None:
        if value is None:
            return None
        if not isinstance(value, self.value_type):
            raise TypeError(f"this column holds a {self.value_type.__name__}, not a {type(value).__name__}")
        return value.to_json()

    def process_result_value(self, value: dict[str, Any] | None, dialect: Dialect) -> Any:
        return None if value is None else self.value_type.from_json(value)


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


class Tenant(Base):
    __tablename__ = "tenants"
    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(String(64), unique=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    tier: Mapped[str] = mapped_column(String(16), default="standard")
    pii_policy: Mapped[str] = mapped_column(String(16), default="warn", server_default="warn")
    created_at: Mapped[int] = mapped_column(BigInteger)
    # Quota overrides (services/tenancy/quotas.py): NULL takes the tier's default, -1 means no limit.
    max_concurrent_jobs: Mapped[int | None] = mapped_column(Integer, nullable=True)
    max_queued_jobs: Mapped[int | None] = mapped_column(Integer, nullable=True)
    gpu_hours_hard: Mapped[float | None] = mapped_column(Float, nullable=True)  # per calendar month, UTC
    gpu_hours_soft: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Deletion (services/tenancy/deletion.py): asked at, export archive's key, data purged at. The row
    # stays, a tombstone that the tenant's billing rows (metered tokens, jobs' attempts) still name.
    deleted_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    export_key: Mapped[str | None] = mapped_column(String(1024), nullable=True)
    purged_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class ApiKey(Base):
    """A tenant's API key: only its SHA-256 is stored; `key_id` is the public handle that lists
    and revocation name it by. A key authenticates while it is neither revoked nor expired."""

    __tablename__ = "api_keys"
    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    key_id: Mapped[str] = mapped_column(String(64), unique=True, index=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.tenant_id"), index=True)
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    key_prefix: Mapped[str] = mapped_column(String(16))
    name: Mapped[str | None] = mapped_column(String(128), nullable=True)
    created_at: Mapped[int] = mapped_column(BigInteger)
    expires_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    last_used_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    revoked_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class BaseModelRow(Base):
    __tablename__ = "base_models"
    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    sha256: Mapped[str] = mapped_column(String(64))
    prefix: Mapped[str] = mapped_column(String(512))
    source: Mapped[str] = mapped_column(Text)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    max_position_embeddings: Mapped[int | None] = mapped_column(Integer, nullable=True)
    num_parameters: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    created_at: Mapped[int] = mapped_column(BigInteger)


class FileRow(Base):
    __tablename__ = "files"
    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    file_id: Mapped[str] = mapped_column(String(64), unique=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.tenant_id"))
    filename: Mapped[str] = mapped_column(String(512))
    purpose: Mapped[str] = mapped_column(String(32))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    key: Mapped[str] = mapped_column(String(1024))
    sha256: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16))
    status_details: Mapped[str | None] = mapped_column(Text, nullable=True)
    num_examples: Mapped[int | None] = mapped_column(Integer, nullable=True)
    data_format: Mapped[str | None] = mapped_column(String(32), nullable=True)
    data_kind: Mapped[str | None] = mapped_column(String(32), nullable=True)
    created_at: Mapped[int] = mapped_column(BigInteger)
    expires_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True, index=True)
    # the claim on a file whose validation runs in the background (status processing): who runs
    # it, when it last said so, how far it got, and how many runs started (services/datasets/processing.py)
    validation_owner: Mapped[str | None] = mapped_column(String(128), nullable=True)
    validation_heartbeat: Mapped[float | None] = mapped_column(Float, nullable=True)
    validation_progress: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    validation_runs: Mapped[int] = mapped_column(Integer, default=0, server_default="0")

    __table_args__ = (Index("ix_files_tenant_pk", "tenant_id", "pk"), Index("ix_files_status", "status"))


class UploadRow(Base):
    """An Upload: a file sent in parts (POST /v1/uploads), pending until completed or cancelled,
    expired an hour after it was created."""

    __tablename__ = "uploads"
    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    upload_id: Mapped[str] = mapped_column(String(64), unique=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.tenant_id"))
    filename: Mapped[str] = mapped_column(String(512))
    purpose: Mapped[str] = mapped_column(String(32))
    mime_type: Mapped[str] = mapped_column(String(255))
    size_bytes: Mapped[int] = mapped_column(BigInteger)  # as declared at create
    received_bytes: Mapped[int] = mapped_column(BigInteger, default=0)  # the parts' bytes so far
    status: Mapped[str] = mapped_column(String(16), index=True)
    file_expires_after_s: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    file_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[int] = mapped_column(BigInteger)
    expires_at: Mapped[int] = mapped_column(BigInteger, index=True)


class UploadPartRow(Base):
    __tablename__ = "upload_parts"
    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    part_id: Mapped[str] = mapped_column(String(64), unique=True)
    upload_id: Mapped[str] = mapped_column(ForeignKey("uploads.upload_id"), index=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.tenant_id"))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    key: Mapped[str] = mapped_column(String(1024))
    created_at: Mapped[int] = mapped_column(BigInteger)


class Job(Base):
    __tablename__ = "jobs"
    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(64), unique=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.tenant_id"))
    model: Mapped[str] = mapped_column(String(128))
    base_model_sha256: Mapped[str] = mapped_column(String(64))
    training_file: Mapped[str] = mapped_column(String(64))
    validation_file: Mapped[str | None] = mapped_column(String(64), nullable=True)
    status: Mapped[str] = mapped_column(String(32), index=True)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    seed: Mapped[int] = mapped_column(BigInteger)
    suffix: Mapped[str | None] = mapped_column(String(64), nullable=True)
    user_metadata: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    request: Mapped[JobRequest] = mapped_column(TypedJSON(JobRequest))  # the create body as given
    # what validation resolved (None before): what the trainer runs and the scheduler places
    resolved: Mapped[ResolvedJob | None] = mapped_column(TypedJSON(ResolvedJob), nullable=True)
    fine_tuned_model: Mapped[str | None] = mapped_column(String(256), nullable=True)
    trained_tokens: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    result_files: Mapped[list[Any]] = mapped_column(JSON, default=list)
    error: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    idempotency_key: Mapped[str | None] = mapped_column(String(256), nullable=True)
    request_hash: Mapped[str] = mapped_column(String(64))
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    pause_requested: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    not_before: Mapped[float | None] = mapped_column(Float, nullable=True)  # retry backoff: not admitted before
    created_at: Mapped[int] = mapped_column(BigInteger)
    started_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    finished_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    estimated_finish: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # hash of everything that determines the trained weights (registry/lineage.py): duplicates are pointed out
    config_hash: Mapped[str | None] = mapped_column(String(64), nullable=True)
    eval_results: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)  # with the gate report
    # a job that continues a fine-tuned model or checkpoint (registry/parents.py): model, job_id, step and
    # the prefix of the copy of its adapter the trainer starts from
    parent: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)

    __table_args__ = (
        Index("ix_jobs_tenant_pk", "tenant_id", "pk"),
        UniqueConstraint("tenant_id", "idempotency_key", name="uq_jobs_idempotency"),
    )


class Attempt(Base):
    __tablename__ = "attempts"
    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.job_id"), index=True)
    number: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16), index=True)
    token_hash: Mapped[str] = mapped_column(String(64))
    gpus: Mapped[int] = mapped_column(Integer, default=1)
    placement: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    handle: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    heartbeat_at: Mapped[float] = mapped_column(Float)
    step: Mapped[int] = mapped_column(Integer, default=0)
    total_steps: Mapped[int | None] = mapped_column(Integer, nullable=True)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    last_seq: Mapped[int] = mapped_column(Integer, default=0)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    failure: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # why it ended badly: "platform" (retried), "user" (not retried), "preempted", "out_of_memory"
    failure_class: Mapped[str | None] = mapped_column(String(16), nullable=True)
    started_at: Mapped[float] = mapped_column(Float)
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True)

    __table_args__ = (UniqueConstraint("job_id", "number", name="uq_attempts_job_number"),)


class JobEvent(Base):
    __tablename__ = "job_events"
    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    event_id: Mapped[str] = mapped_column(String(64), unique=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.job_id"))
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    seq: Mapped[int | None] = mapped_column(Integer, nullable=True)
    level: Mapped[str] = mapped_column(String(8))
    event_type: Mapped[str] = mapped_column(String(16))
    message: Mapped[str] = mapped_column(Text)
    data: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    created_at: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (
        Index("ix_job_events_job_pk", "job_id", "pk"),
        UniqueConstraint("job_id", "attempt", "seq", name="uq_job_events_report"),
    )


class Checkpoint(Base):
    __tablename__ = "checkpoints"
    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    checkpoint_id: Mapped[str] = mapped_column(String(64), unique=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.job_id"), index=True)
    step: Mapped[int] = mapped_column(Integer)
    attempt: Mapped[int] = mapped_column(Integer)
    prefix: Mapped[str] = mapped_column(String(1024))
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[int] = mapped_column(BigInteger)
    epoch: Mapped[int | None] = mapped_column(Integer, nullable=True)  # the epoch it ends; none mid-epoch

    __table_args__ = (UniqueConstraint("job_id", "step", name="uq_checkpoints_job_step"),)


class FineTunedModel(Base):
    __tablename__ = "fine_tuned_models"
    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    model_id: Mapped[str] = mapped_column(String(256), unique=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.tenant_id"), index=True)
    # None: registered from a training-API checkpoint (`lineage` names the run and checkpoint)
    job_id: Mapped[str | None] = mapped_column(ForeignKey("jobs.job_id"), nullable=True)
    base_model: Mapped[str] = mapped_column(String(128))
    base_model_sha256: Mapped[str] = mapped_column(String(64))
    artifact_prefix: Mapped[str] = mapped_column(String(1024))
    created_at: Mapped[int] = mapped_column(BigInteger)
    # registry (registry/models.py): stage, gates, lineage; artifacts are immutable once registered
    artifact_kind: Mapped[str] = mapped_column(String(16), default="adapter", server_default="adapter")
    stage: Mapped[str] = mapped_column(String(16), default="dev", server_default="dev")
    promotable: Mapped[bool] = mapped_column(Boolean, default=True, server_default=true())
    eval_results: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    gate_report: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    lineage: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    config_hash: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    deprecated_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    delete_after: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    artifacts_deleted_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class ModelStageChange(Base):
    """The audit trail of a fine-tuned model's stages: who moved it, from where to where,
    and whether an admin overrode a failed gate (with the reason given)."""

    __tablename__ = "model_stage_changes"
    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    model_id: Mapped[str] = mapped_column(ForeignKey("fine_tuned_models.model_id"), index=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.tenant_id"))
    from_stage: Mapped[str] = mapped_column(String(16))
    to_stage: Mapped[str] = mapped_column(String(16))
    actor: Mapped[str] = mapped_column(String(128))  # "tenant:<id>" or "admin"
    override: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[int] = mapped_column(BigInteger)


class WebhookEndpoint(Base):
    """Where a tenant wants job outcomes POSTed (services/webhooks/subscriptions.py). A deleted endpoint keeps
    its row (disabled_at set) so its deliveries stay readable and their foreign key valid."""

    __tablename__ = "webhook_endpoints"
    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    endpoint_id: Mapped[str] = mapped_column(String(64), unique=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.tenant_id"))
    url: Mapped[str] = mapped_column(String(2048))
    # sealed (security/crypto.py): every delivery is signed with it, so it must be readable back
    secret: Mapped[str] = mapped_column(Text)
    event_types: Mapped[list[Any]] = mapped_column(JSON)
    created_at: Mapped[int] = mapped_column(BigInteger)
    disabled_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)

    __table_args__ = (Index("ix_webhook_endpoints_tenant_pk", "tenant_id", "pk"),)


class WebhookDelivery(Base):
    """The outbox: one row per (event, endpoint), written in the transaction that changed the
    job and sent later by services/webhooks/delivery.py."""

    __tablename__ = "webhook_deliveries"
    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    delivery_id: Mapped[str] = mapped_column(String(64), unique=True)  # the event id, "evt_..."
    endpoint_id: Mapped[str] = mapped_column(ForeignKey("webhook_endpoints.endpoint_id"))
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.tenant_id"))
    event_type: Mapped[str] = mapped_column(String(64))
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16))  # pending | delivered | failed
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    # unix seconds: when a pending delivery is due; a claimed one is pushed past its send's end
    next_attempt_at: Mapped[float] = mapped_column(Float)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    last_status_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at: Mapped[int] = mapped_column(BigInteger)
    delivered_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)

    __table_args__ = (
        Index("ix_webhook_deliveries_due", "status", "next_attempt_at"),
        Index("ix_webhook_deliveries_endpoint_pk", "endpoint_id", "pk"),
    )


class TenantSecret(Base):
    """A credential a tenant stores for the platform to use on its behalf (e.g. the API key of
    its LLM judge), referenced by name from job configs. The value is sealed
    (security/crypto.py) and never shown again (services/tenancy/secrets.py)."""

    __tablename__ = "tenant_secrets"
    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.tenant_id"))
    name: Mapped[str] = mapped_column(String(64))
    value: Mapped[str] = mapped_column(Text)  # sealed
    created_at: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (UniqueConstraint("tenant_id", "name", name="uq_tenant_secrets_tenant_name"),)


class MeteredTokens(Base):
    """Tokens a tenant spent on something other than GPU time, one row per batch asked (e.g. the
    judges of its graders: services/serving/judges.py); summed by services/tenancy/usage.py."""

    __tablename__ = "metered_tokens"
    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.tenant_id"))
    job_id: Mapped[str | None] = mapped_column(String(64), nullable=True)  # None: not a job's (graders/run)
    kind: Mapped[str] = mapped_column(String(32))  # judge.served | judge.operator | judge.tenant
    model: Mapped[str] = mapped_column(String(256))
    requests: Mapped[int] = mapped_column(Integer)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger)
    completion_tokens: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[int] = mapped_column(BigInteger)
    # the share of a shared device's time these tokens took (training API cycles); None: not on ours
    device_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)

    __table_args__ = (Index("ix_metered_tokens_tenant_created", "tenant_id", "created_at"),)


class Route(Base):
    """A tenant's A/B route (services/serving/routes.py): a name that requests use as `model: "route:NAME"`,
    and the versions (fine-tuned or base models) it splits traffic between, by integer weight."""

    __tablename__ = "routes"
    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    route_id: Mapped[str] = mapped_column(String(64), unique=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.tenant_id"))
    name: Mapped[str] = mapped_column(String(64))
    versions: Mapped[list[Any]] = mapped_column(JSON)  # [{"model": id, "weight": int}], in order
    created_at: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (UniqueConstraint("tenant_id", "name", name="uq_routes_tenant_name"),)


class RouteRequest(Base):
    """One request a route served: which version, how it went and how long it took, and the
    feedback score the tenant later gave its answer (by the answer's id)."""

    __tablename__ = "route_requests"
    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    response_id: Mapped[str] = mapped_column(String(64), unique=True)  # "chatcmpl-…" / "cmpl-…"
    route_id: Mapped[str] = mapped_column(ForeignKey("routes.route_id"))
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.tenant_id"))
    model: Mapped[str] = mapped_column(String(256))
    outcome: Mapped[str] = mapped_column(String(16))  # ok | error | cancelled
    latency_ms: Mapped[float] = mapped_column(Float)
    first_token_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    feedback: Mapped[float | None] = mapped_column(Float, nullable=True)
    created_at: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (Index("ix_route_requests_route_created", "route_id", "created_at"),)


class Sweep(Base):
    """A hyperparameter sweep (services/training/sweeps.py): a base job body, a search space, a sampler,
    an objective and early stopping; its trials are ordinary jobs."""

    __tablename__ = "sweeps"
    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    sweep_id: Mapped[str] = mapped_column(String(64), unique=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.tenant_id"))
    status: Mapped[str] = mapped_column(String(16), index=True)  # running | succeeded | failed | cancelled
    config: Mapped[dict[str, Any]] = mapped_column(JSON)  # the request as checked
    best_job_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    error: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    created_at: Mapped[int] = mapped_column(BigInteger)
    finished_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)

    __table_args__ = (Index("ix_sweeps_tenant_pk", "tenant_id", "pk"),)


class SweepTrial(Base):
    """One trial of a sweep: its parameters, its job, and what early stopping saw of it."""

    __tablename__ = "sweep_trials"
    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    sweep_id: Mapped[str] = mapped_column(ForeignKey("sweeps.sweep_id"), index=True)
    number: Mapped[int] = mapped_column(Integer)
    job_id: Mapped[str | None] = mapped_column(ForeignKey("jobs.job_id"), nullable=True)
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16))  # pending | running | completed | stopped | failed
    rungs: Mapped[list[Any]] = mapped_column(JSON)  # the objective at each rung it passed
    objective: Mapped[float | None] = mapped_column(Float, nullable=True)  # its final value
    created_at: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (UniqueConstraint("sweep_id", "number", name="uq_sweep_trials_sweep_number"),)


class TenantDataKey(Base):
    """A tenant's key for its objects' data keys (storage/envelope.py), sealed under the
    operator's key (security/crypto.py). Revoked: `sealed` is erased and `revoked_at` set; what
    was sealed under it can no longer be opened by anyone (services/tenancy/data_keys.py)."""

    __tablename__ = "tenant_data_keys"
    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(String(64), index=True)
    key_id: Mapped[str] = mapped_column(String(64), unique=True)
    sealed: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[int] = mapped_column(BigInteger)
    revoked_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class AuditRecord(Base):
    """One mutation of the platform's state, appended and never changed (db/repos/audit.py has no
    update or delete; on PostgreSQL a trigger refuses both). Kept when its tenant is deleted, like
    billing, so `tenant_id` is no foreign key. `summary` is small and bounded: ids, names, a status,
    never a secret or a file's content."""

    __tablename__ = "audit_log"
    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    created_at: Mapped[float] = mapped_column(Float)
    actor: Mapped[str] = mapped_column(String(16))  # tenant | admin | platform
    tenant_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    key_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    action: Mapped[str] = mapped_column(String(128))
    resource_type: Mapped[str] = mapped_column(String(64))
    resource_id: Mapped[str | None] = mapped_column(String(256), nullable=True)
    status_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    request_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    summary: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)

    __table_args__ = (Index("ix_audit_log_tenant_pk", "tenant_id", "pk"),
                      Index("ix_audit_log_resource", "resource_id"))


# Append-only where the database can hold it: PostgreSQL refuses UPDATE, DELETE and TRUNCATE of
# audit rows (the same DDL as migration 0016, for a database created from these definitions).
_AUDIT_TRIGGERS = (
    "CREATE OR REPLACE FUNCTION audit_log_append_only() RETURNS trigger AS $$ BEGIN "
    "RAISE EXCEPTION 'audit_log is append-only: %% refused', TG_OP; END; $$ LANGUAGE plpgsql",
    "CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log "
    "FOR EACH ROW EXECUTE FUNCTION audit_log_append_only()",
    "CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log "
    "FOR EACH STATEMENT EXECUTE FUNCTION audit_log_append_only()",
)
for _statement in _AUDIT_TRIGGERS:
    event.listen(AuditRecord.__table__, "after_create", DDL(_statement).execute_if(dialect="postgresql"))
