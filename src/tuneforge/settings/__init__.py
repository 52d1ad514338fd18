"""Typed settings, read from `TUNEFORGE_*` environment variables.

Nothing is built at import: call `get_settings()` (cached) or build a
`Settings(...)` explicitly, as tests do.
"""

from __future__ import annotations

import os
import sys
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from tuneforge.domain.vocab import TIERS
from tuneforge.settings.cluster import CapacityPool, ClusterSettings
from tuneforge.settings.gates import GateSettings
from tuneforge.settings.money import MoneySettings
from tuneforge.settings.serving import ServingSettings

__all__ = ["CapacityPool", "RateLimitTier", "Settings", "get_settings"]


class RateLimitTier(BaseModel):
    """The request limits of one tier, per tenant (api/ratelimits.py applies them)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    requests_per_s: float | None = Field(
        default=None, ge=0, description="Sustained requests per second of one tenant; 0 or null: no rate limit.")
    window_s: int = Field(
        default=1, ge=1, le=3600, description="Requests are counted in windows of this many seconds: a tenant "
                                              "may send requests_per_s x window_s requests per window, all at "
                                              "once if it likes (the burst); the next one waits for the window's "
                                              "end (Retry-After).")
    concurrent: int | None = Field(
        default=None, ge=0, description="Requests of one tenant in flight at once on the API (divided among "
                                        "the API's worker processes); 0 or null: unbounded.")

    @model_validator(mode="after")
    def _whole_requests_per_window(self) -> RateLimitTier:
        if self.requests_per_s:
            per_window = self.requests_per_s * self.window_s
            if per_window < 1 or abs(per_window - round(per_window)) > 1e-9:
                raise ValueError(f"requests_per_s x window_s must be a whole number of requests, at least 1 "
                                 f"(got {self.requests_per_s} x {self.window_s})")
        return self

    @property
    def requests_per_window(self) -> int:
        """Requests allowed per window; 0: no rate limit."""
        return round((self.requests_per_s or 0) * self.window_s)


# Far above what the SDK, the CLI or a console send in normal use; free and standard keep one tenant's loop
# from taking a whole API process (about 200 job reads/s on two cores, docs/benchmarks-api.md).
DEFAULT_RATE_LIMITS: dict[str, dict[str, float | int | None]] = {
    "free": {"requests_per_s": 20, "window_s": 1, "concurrent": 16},
    "standard": {"requests_per_s": 100, "window_s": 1, "concurrent": 64},
    "premium": {"requests_per_s": 500, "window_s": 1, "concurrent": 256},
}


def default_home() -> Path:
    """The per-user data folder every command finds whatever the working directory."""
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / "tuneforge"
    xdg = os.environ.get("XDG_DATA_HOME", "")
    return (Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".local" / "share") / "tuneforge"


class Settings(ClusterSettings, ServingSettings, MoneySettings, GateSettings, BaseSettings):
    # protected_namespaces=(): fields such as model_delete_grace_s are settings, not pydantic API (older
    # pydantic releases warn about the "model_" prefix otherwise)
    model_config = SettingsConfigDict(env_prefix="TUNEFORGE_", extra="ignore", protected_namespaces=())

    home: Path = Field(
        default_factory=lambda: default_home(),
        description="Folder for the embedded defaults: SQLite database, object store, logs, caches. Default: "
                    "the user's data folder ($XDG_DATA_HOME/tuneforge, else ~/.local/share/tuneforge; on macOS "
                    "~/Library/Application Support/tuneforge), the same wherever a command runs.",
    )
    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL of the metadata store; default SQLite at HOME/tuneforge.db. "
        "PostgreSQL: postgresql+psycopg://user:pass@host:5432/db",
    )
    database_pool_size: int = Field(
        default=10, ge=1, le=1000,
        description="PostgreSQL: connections each process keeps open (API workers, the scheduler's process).")
    database_max_overflow: int = Field(
        default=30, ge=0, le=1000,
        description="PostgreSQL: connections a process may open beyond the pool under load, closed when "
                    "returned. Per process at most pool + overflow: keep the sum over all processes and "
                    "replicas under the server's max_connections.")
    storage_url: str | None = Field(
        default=None,
        description="Object store root: a local folder (default HOME/objects) or s3://bucket/prefix.",
    )
    s3_endpoint_url: str | None = Field(
        default=None, description="S3 endpoint for S3-compatible stores (MinIO, moto, Ceph)."
    )
    s3_region: str | None = Field(default=None, description="S3 region name.")
    s3_access_key_id: str | None = Field(
        default=None, description="S3 access key; default: the usual AWS credential chain."
    )
    s3_secret_access_key: str | None = Field(default=None, description="S3 secret key.")

    trainer_storage: Literal["proxy", "direct"] = Field(
        default="proxy",
        description="How trainers reach the object store. 'proxy' (default): through the control plane's "
                    "object routes with their job token, which answer only for their own job's objects, data "
                    "and starting weights; a trainer holds no store credential (docs/security.md). 'direct': "
                    "the store's URL and TUNEFORGE_S3_* credentials are handed to every trainer, which can "
                    "then read every tenant's objects; only for a single-tenant cluster that needs the "
                    "store's bandwidth without the control plane in the path.")
    trainer_object_max_bytes: int = Field(
        default=256 * 1024**3, ge=1,
        description="The largest object a trainer may write through the object proxy (bytes); a larger "
                    "upload is refused with 413 and nothing of it is kept.")
    s3_sse: str | None = Field(
        default=None, description="Server-side encryption of every object written to S3: 'AES256' (S3-managed "
                                  "keys) or 'aws:kms' (with TUNEFORGE_S3_SSE_KMS_KEY_ID, else the account's "
                                  "default KMS key); unset: the bucket's default.")
    s3_sse_kms_key_id: str | None = Field(default=None, description="KMS key id or ARN for s3_sse = 'aws:kms'.")
    encrypt_tenant_objects: bool = Field(
        default=False, description="Envelope encryption of every object under a tenant's prefix "
                                   "(storage/envelope.py): a data key per object, wrapped by the tenant's own key, "
                                   "itself sealed under the secrets key; revoking a tenant's key "
                                   "(`tuneforge tenants revoke-data-key`, tenant deletion) makes its data unreadable. "
                                   "Trainers must then read through the control plane.")
    secrets_key: str | None = Field(
        default=None, description="Fernet keys (comma-separated, newest first) sealing tenant secrets and webhook "
                                  "signing secrets at rest; unset: a key generated once in HOME/secrets.key. "
                                  "Control planes sharing a database must share it (docs/security.md).")
    eval_endpoints: dict[str, dict[str, str]] = Field(
        default_factory=dict,
        description='Judge and guard endpoints the operator offers, by name (JSON), e.g. {"judge": {"url": '
                    '"https://llm.internal/v1", "model": "judge-70b", "api_key": "..."}}; a tenant\'s eval picks '
                    'one as "endpoint_name" and never sees its URL or key. These are trusted: the egress '
                    'policy does not apply to them.')
    grader_python: str = Field(
        default="/usr/bin/python3",
        description="The interpreter python graders run with, inside the sandbox (bubblewrap): the OS's python, "
                    "whose prefix (/usr) the sandbox binds read-only; never the platform's own environment.")
    grader_embeddings: str | None = Field(
        default=None, max_length=64,
        description="One of TUNEFORGE_EVAL_ENDPOINTS, by name, whose /embeddings answers the cosine metric of "
                    "text_similarity graders; unset: cosine is refused.")
    grader_timeout_s: float = Field(
        default=5.0, gt=0.0, le=600.0,
        description="Wall time a python grader may take on one sample before it scores 0 (timed out).")
    rft_vllm_gpu_memory: float = Field(
        default=0.0, ge=0.0, lt=1.0,
        description="Reinforcement rollouts on vLLM: the fraction of a GPU trainer's memory given to an in-process "
                    "vLLM engine for the base model (LoRA jobs on one process, where the vllm package is installed; "
                    "train/vllm_rollouts.py). 0: the trainer samples itself.")
    training_api_models_per_tenant: dict[str, int] = Field(
        default_factory=lambda: {"free": 2, "standard": 8, "premium": 32},
        description="Training-API models (LoRA training clients of /tinker) one tenant may hold at once, by tier "
                    "(JSON); one more answers 429 with Retry-After. A model of a finished session, or released "
                    "when idle, does not count.")
    training_api_queued_per_tenant: dict[str, int] = Field(
        default_factory=lambda: {"free": 64, "standard": 256, "premium": 1024},
        description="Training-API requests of one tenant waiting or running at once (forward_backward, optim_step, "
                    "sample, ...), by tier (JSON); one more answers 429 with Retry-After.")
    training_api_cycle_tokens: int = Field(
        default=32_768, ge=256,
        description="Tokens one co-training cycle passes through a shared base at most (every tenant's "
                    "forward_backward requests together; a single larger request runs alone). Tenants share a cycle "
                    "round-robin, so one tenant's large batch cannot starve another's.")
    training_api_idle_s: float = Field(
        default=900.0, gt=0.0,
        description="A training-API model without a request for this long is released from its worker (its weights "
                    "and optimizer are kept in the object store; its next request brings it back).")
    training_api_workers: Literal["scheduled", "process"] = Field(
        default="scheduled",
        description="How the training API's co-training workers get their GPUs: scheduled (each is a job of the "
                    "platform's own, placed by the scheduler on the executor's GPUs like any job, preempted and "
                    "restarted elsewhere with its models' state) or process (a process of the API's host, beside "
                    "whatever the scheduler runs: for a control plane without an executor).")
    training_api_upstream: str = Field(
        default="", description="Internal, set by `tuneforge serve` for its API worker processes: where the "
                                "parent process serves the training API, which the workers forward it to.")
    scheduler_in_parent: bool = Field(
        default=False, description="Internal, set by `tuneforge serve` for its API worker processes: the parent "
                                   "process runs the scheduler (what /healthz of a worker reports).")
    training_api_pool_device: str = Field(
        default="auto", pattern=r"^(auto|cpu|cuda(:[0-9]+)?)$",
        description="Where the training API's co-training workers run: auto (a GPU when there is one), cpu, cuda, "
                    "cuda:N.")
    pool_jobs_max_rank: int = Field(
        default=0, ge=0, le=128,
        description="Small ordinary jobs on the training API's shared co-training pool: a supervised LoRA job "
                    "(one GPU, dropout 0, all-linear targets, not continuing a model) whose rank is at most this, "
                    "and whose steps and trained tokens are within TUNEFORGE_POOL_JOBS_MAX_STEPS and "
                    "TUNEFORGE_POOL_JOBS_MAX_TOKENS, trains as a client of its base model's shared worker instead "
                    "of taking GPUs of its own. 0: off (every job takes its own GPUs).")
    pool_jobs_max_steps: int = Field(
        default=500, ge=1, description="Most optimizer steps a job may take to run on the shared pool.")
    pool_jobs_max_tokens: int = Field(
        default=2_000_000, ge=1,
        description="Most trained tokens (every epoch counted) a job may have to run on the shared pool.")
    grader_sandboxes: int = Field(
        default=4, ge=1, le=256,
        description="Python-grader sandboxes one API process runs at once for /v1/fine_tuning/alpha/graders "
                    "(a request over it is answered 429 with Retry-After).")

    host: str = Field(default="127.0.0.1", description="Address the API binds to.")
    port: int = Field(default=8000, description="Port the API binds to.")
    api_workers: int | None = Field(
        default=None, ge=1, le=256,
        description="API worker processes of `tuneforge up`/`serve` (default: the CPU count). The scheduler, "
                    "executor and webhook dispatcher run once, in the parent process. Embedded control planes "
                    "(the demo, tests) always serve from one process.")
    opentelemetry: bool = Field(
        default=False,
        description="FastAPI's OpenTelemetry spans, metrics and logs per request, exported through the "
                    "OpenTelemetry SDK you configure. Off by default: it costs CPU on every request.")
    public_url: str | None = Field(
        default=None,
        description="URL trainers use to reach the control plane; default http://HOST:PORT.",
    )

    admin_api_key: str | None = Field(
        default=None, description="Bearer key of the admin API (/v1/admin/...); unset: the admin API is off.")
    docs_access: str = Field(
        default="admin", pattern="^(public|admin|off)$",
        description="Who may read the API reference (/docs, /redoc, /openapi.json): 'public' (anyone), 'admin' "
                    "(the admin API key; off while none is set) or 'off' (404).")
    rate_limits: dict[str, RateLimitTier | None] = Field(
        default_factory=lambda: {tier: RateLimitTier(**limits) for tier, limits in DEFAULT_RATE_LIMITS.items()},
        description='Request limits per tenant, by tier (JSON): requests_per_s, window_s, concurrent, e.g. '
                    '{"free": {"requests_per_s": 5}, "premium": null}. A tier or field not given keeps its default '
                    '(free 20/s, standard 100/s, premium 500/s; 16, 64, 256 in flight; 1 s windows); 0 or null '
                    'lifts a limit, null for a tier lifts both. Over a limit a request answers 429 with '
                    'Retry-After (docs/operations.md, "Rate limits").')
    rate_limit_storage: str | None = Field(
        default=None,
        description="Where the request counters live (a `limits` storage URI): 'memory://' (this process only), "
                    "'tuneforge+sqlite:///PATH' (a SQLite file the API processes of one host share), "
                    "'database' (the platform's PostgreSQL database; on SQLite, HOME/ratelimit.db), "
                    "'tuneforge+postgresql://...', or 'redis://host:6379' (pip install 'tuneforge[redis]'); "
                    "unset: memory:// for one API process, HOME/ratelimit.db for several.")
    qlora: str = Field(
        default="auto", description="Whether trainers can run QLoRA (CUDA + bitsandbytes): 'on', 'off', or 'auto' "
                                    "(on when this host has an NVIDIA driver and bitsandbytes; set 'on' when "
                                    "trainers run elsewhere, e.g. on a GPU cluster).")
    fused_loss: Literal["auto", "off", "chunked", "liger"] = Field(
        default="auto", description="Token losses without the B x S x V logits (train/fused_loss.py): 'chunked' "
                                    "(pure torch, any device), 'liger' (Liger's fused kernel: CUDA and the "
                                    "liger-kernel package), 'auto' (liger where it runs, else chunked), 'off'.")
    max_upload_bytes: int = Field(
        default=8 * 1024 * 1024 * 1024, description="Largest accepted file upload in bytes (premium tier)."
    )
    max_upload_bytes_free: int = Field(
        default=256 * 1024 * 1024, description="Largest accepted file upload in bytes for the free tier."
    )
    max_upload_bytes_standard: int = Field(
        default=2 * 1024 * 1024 * 1024, description="Largest accepted file upload in bytes for the standard tier."
    )
    inline_validation_max_bytes: int = Field(
        default=32 * 1024 * 1024,
        description="Jobs whose training and validation files together are at most this size are validated "
                    "within the create request, so create returns the job with its estimate; larger ones are "
                    "validated by the scheduler (status validating_files) and show it once validated.",
    )
    upload_validate_wait_s: float = Field(
        default=1.5, ge=0.0, le=60.0,
        description="How long an upload of a fine-tune file waits for its validation before it answers: a file "
                    "checked within this time comes back processed (or error) in one call, a longer check comes "
                    "back processing and goes on in the background (poll the file; the SDK's "
                    "files.wait_for_processing does). 0: always answer at once.")
    upload_validate_concurrency: int = Field(
        default=2, ge=1, le=64,
        description="Validations of uploaded files one control plane process runs at once (each in a worker "
                    "process of its own); more wait their turn, still processing.")
    upload_validate_lease_s: float = Field(
        default=30.0, ge=2.0,
        description="A validation whose process has not renewed its claim on the file for this long is taken "
                    "as lost (the process died) and is run again by the scheduler's file_checks duty.")
    upload_validate_heartbeat_s: float = Field(
        default=1.0, gt=0.0,
        description="How often a running validation renews its claim and records its progress on the file.")
    upload_validate_max_runs: int = Field(
        default=3, ge=1,
        description="Times a file's validation is started before a file whose checks keep ending their "
                    "process fails with check_failed instead of being run again.")
    divergence_loss_multiple: float = Field(
        default=4.0, description="A smoothed train loss above this multiple of its lowest value so far ...")
    divergence_patience_steps: int = Field(
        default=20, description="... for this many steps in a row stops the job as training_diverged.")
    divergence_min_increase: float = Field(
        default=1.0, description="... when it is also at least this many nats above the lowest value.")
    min_training_examples: int = Field(
        default=10, description="A training file with fewer examples is rejected."
    )
    default_checkpoint_every_steps: int = Field(
        default=50, description="Checkpoint period in optimizer steps when a job sets none."
    )
    default_checkpoint_keep_last: int = Field(
        default=3, description="Checkpoints kept per job when a job sets none."
    )
    openai_strict_status: bool = Field(
        default=True, description="A job's `status` stays within the openai SDK's values: `evaluating` shows as "
                                  "`running` (an event says the eval began), a running job asked to pause as "
                                  "`pausing`; `precise_status` always has tuneforge's own. Off: `status` is the "
                                  "precise one.")

    max_streams_per_tenant: int = Field(
        default=32, ge=1, description="Event streams (GET /v1/fine_tuning/jobs/{id}/events?stream=true) one tenant "
                                      "may hold open at once; one more answers 429 with Retry-After. Counted in "
                                      "each API process: with N processes a tenant may hold N times this many.")
    stream_poll_s: float = Field(
        default=1.0, gt=0.0, description="An open event stream that nothing has woken re-reads its job's events "
                                         "this often: how late events written by another process reach it when "
                                         "no notification does (SQLite, or PostgreSQL while LISTEN is down).")
    stream_keepalive_s: float = Field(
        default=15.0, gt=0.0, description="A stream (job events, chat and completions) with nothing to send "
                                          "sends a comment line this often, so proxies keep the connection.")
    stream_listen: bool = Field(
        default=True, description="PostgreSQL: event streams are woken through LISTEN/NOTIFY as soon as any "
                                  "process commits an event of their job; off: by this process's own commits "
                                  "and the poll (TUNEFORGE_STREAM_POLL_S) only.")

    def max_upload_bytes_by_tier(self, tier: str) -> int:
        return {"free": self.max_upload_bytes_free, "standard": self.max_upload_bytes_standard}.get(
            tier, self.max_upload_bytes)

    gpu_type: str = Field(default="default", description="GPU type jobs run on when they ask for none.")
    gpu_effective_tflops: float = Field(
        default=100.0,
        description="Sustained training TFLOP/s of one GPU (peak x expected MFU), for runtime estimates.",
    )
    price_per_gpu_hour: dict[str, float] = Field(
        default_factory=lambda: {"default": 2.0},
        description='Price table per GPU type, e.g. {"a100-80gb": 2.5, "h100": 4.0} (JSON in the environment).',
    )
    price_currency: str = Field(default="USD", description="Currency of the price table.")
    price_per_million_tokens: dict[str, float] = Field(
        default_factory=dict,
        description='Price of metered tokens per million, by kind (JSON), e.g. {"judge.served": 0.2, '
                    '"judge.operator": 1.0}; kinds: judge.served (a model graders\' judge this platform serves), '
                    'judge.operator (an operator endpoint), judge.tenant (the tenant\'s own endpoint). A kind '
                    'without a price is metered at 0.')
    eval_by_default: bool = Field(
        default=True, description="Evaluate every job after training (status evaluating) unless its body says "
                                  "eval.enabled = false.")
    eval_golden_max_loss_increase: float = Field(
        default=0.5, description="Default gate: golden-set loss may rise at most this much (nats) over the base.")
    eval_golden_max_accuracy_drop: float = Field(
        default=0.10, description="Default gate: golden-set token accuracy may fall at most this much.")
    eval_safety_max_refusal_drop: float = Field(
        default=0.10, description="Default gate: the refusal rate on harmful prompts may fall at most this much.")
    benchmark_dir: Path | None = Field(
        default=None, description="Folder of benchmark tasks in lm-eval's task format (YAML files with their data "
                                  "in local JSON files beside them); default HOME/benchmarks. Jobs name tasks "
                                  "from it (eval.benchmarks); trainers read it at the same path.")
    benchmark_tasks: list[str] = Field(
        default_factory=list, description='Benchmark tasks every evaluated job runs when its body names none '
                                          '(JSON list of task names in the benchmark folder), e.g. ["arc_easy"].')
    benchmark_max_regression_points: float = Field(
        default=2.0, ge=0, description="Default gate per benchmark task: the fine-tuned score may fall at most this "
                                       "many points (0-100) below the base model's.")
    benchmark_batch_size: int = Field(
        default=16, ge=1, le=1024, description="Sequences per forward pass when the trainer scores benchmark tasks "
                                               "(multiple-choice pairs, or prompts decoded together).")
    model_delete_grace_s: float = Field(
        default=7 * 86400.0, description="A deleted fine-tuned model's artifacts are removed after this long "
                                         "(it can be restored until then).")
    webhook_timeout_s: float = Field(
        default=10.0, description="A webhook receiver must answer within this long (per connect, send and "
                                  "read), or the attempt counts as failed and is retried.")
    webhook_max_attempts: int = Field(
        default=8, description="Attempts per webhook event; after the last failed one the delivery is failed.")
    webhook_backoff_s: float = Field(
        default=10.0, description="Wait after a webhook's first failed attempt; doubles after each further one.")
    webhook_backoff_max_s: float = Field(default=3600.0, description="Longest wait between webhook attempts.")
    webhook_poll_s: float = Field(
        default=1.0, description="How often an idle control plane looks for due webhook deliveries.")
    egress_allow: str = Field(
        default="", description="Comma-separated IP addresses, CIDRs and host names the platform may connect to "
                                "on a tenant's behalf (webhooks, eval endpoints) besides public addresses, e.g. "
                                "'10.0.0.0/8,hooks.internal'; empty: public addresses only.")

    wandb_mode: str = Field(
        default="online", pattern="^(online|offline|off)$",
        description="The wandb integration: 'online' (trainers log to wandb_base_url with the tenant's own W&B "
                    "API key, a tenant secret), 'offline' (runs written as W&B offline files kept beside the job, "
                    "downloadable for `wandb sync`; no key needed: air-gapped clusters) or 'off' (refused).")
    wandb_base_url: str = Field(
        default="https://api.wandb.ai",
        description="The W&B server trainers log to (a self-hosted W&B's URL, or W&B's own). Operator-chosen: "
                    "tenants pick project, entity, name and tags, never the server.")
    mlflow_tracking_uri: str | None = Field(
        default=None,
        description="The operator's MLflow tracking server or store (http(s)://, or a file:/database URI every "
                    "trainer host can reach) for mlflow integrations that name no tracking_uri of their own; "
                    "unset: such an integration is refused.")
    mlflow_tracking_token: str | None = Field(
        default=None, description="Bearer token for mlflow_tracking_uri when it is an http(s) server that wants one; "
                                  "handed to trainers per attempt, never put in their environment.")

    @field_validator("egress_allow")
    @classmethod
    def _readable_allow_list(cls, value: str) -> str:
        from tuneforge.security.egress import EgressPolicy  # loaded only when the setting is given

        EgressPolicy.parse(value)  # a bad entry stops the process at start, naming the entry
        return value

    @field_validator("rate_limits", mode="before")
    @classmethod
    def _rate_limits_over_defaults(cls, value: object) -> object:
        """Every tier gets its limits: a tier the setting names takes the fields it gives over its defaults."""
        if not isinstance(value, dict):
            return value  # pydantic says what is wrong with it
        unknown = sorted(str(tier) for tier in value if tier not in TIERS)
        if unknown:
            raise ValueError(f"TUNEFORGE_RATE_LIMITS names unknown tier(s) {', '.join(unknown)}; "
                             f"the tiers are {', '.join(TIERS)}")
        merged: dict[str, object] = {}
        for tier in TIERS:
            given = value.get(tier, {})
            if given is None or isinstance(given, RateLimitTier):
                merged[tier] = given
            elif isinstance(given, dict):
                merged[tier] = {**DEFAULT_RATE_LIMITS.get(tier, {}), **given}
            else:
                merged[tier] = given  # not an object: pydantic's error names the tier
        return merged

    @field_validator("rate_limit_storage")
    @classmethod
    def _known_rate_limit_storage(cls, value: str | None) -> str | None:
        from tuneforge.db.ratelimit_storage import check_storage_uri  # `limits` loads only when it is given

        if value is not None:
            check_storage_uri(value)  # a scheme nothing stores counters under stops the process at start
        return value

    @field_validator("s3_sse")
    @classmethod
    def _known_sse(cls, value: str | None) -> str | None:
        if value is not None and value not in ("AES256", "aws:kms"):
            raise ValueError("TUNEFORGE_S3_SSE must be 'AES256' or 'aws:kms'")
        return value

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.home / 'tuneforge.db').resolve()}"

    @property
    def resolved_storage_url(self) -> str:
        if self.storage_url:
            return self.storage_url
        return str((self.home / "objects").resolve())

    @property
    def resolved_benchmark_dir(self) -> Path:
        return (self.benchmark_dir or self.home / "benchmarks").resolve()

    @property
    def resolved_api_workers(self) -> int:
        return self.api_workers or max(1, os.cpu_count() or 1)

    @property
    def resolved_public_url(self) -> str:
        if self.public_url:
            return self.public_url.rstrip("/")
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return f"http://{host}:{self.port}"

    def trainer_env(self) -> dict[str, str]:
        """The platform's variables a trainer gets (security/env.py passes it nothing else of ours):
        the egress allow-list its eval endpoints are checked against, and, only where the operator
        chose `trainer_storage = "direct"`, its object store's settings (credentials included)."""
        env = self.trainer_storage_env() if self.trainer_storage == "direct" else {}
        if self.egress_allow:
            env["TUNEFORGE_EGRESS_ALLOW"] = self.egress_allow
        return env

    def trainer_storage_env(self) -> dict[str, str]:
        """The TUNEFORGE_S3_* variables a trainer needs to open the same object store."""
        env = {}
        for name in ("s3_endpoint_url", "s3_region", "s3_access_key_id", "s3_secret_access_key", "s3_sse",
                     "s3_sse_kms_key_id"):
            value = getattr(self, name)
            if value:
                env[f"TUNEFORGE_{name.upper()}"] = str(value)
        return env

    def storage_options(self) -> dict[str, object]:
        """fsspec options for the object store (S3 endpoint and credentials)."""
        if not self.resolved_storage_url.startswith("s3://"):
            return {}
        options: dict[str, object] = {}
        client_kwargs: dict[str, str] = {}
        if self.s3_endpoint_url:
            client_kwargs["endpoint_url"] = self.s3_endpoint_url
        if self.s3_region:
            client_kwargs["region_name"] = self.s3_region
        if client_kwargs:
            options["client_kwargs"] = client_kwargs
        if self.s3_access_key_id:
            options["key"] = self.s3_access_key_id
        if self.s3_secret_access_key:
            options["secret"] = self.s3_secret_access_key
        if self.s3_sse:
            sse = {"ServerSideEncryption": self.s3_sse}
            if self.s3_sse_kms_key_id:
                sse["SSEKMSKeyId"] = self.s3_sse_kms_key_id
            options["s3_additional_kwargs"] = sse
        return options


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
