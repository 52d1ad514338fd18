"""Settings of serving: the built-in inference engine, A/B routes and the hand-off to vLLM
servers. Part of `tuneforge.settings.Settings` (read from `TUNEFORGE_*` like the rest)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, PositiveInt, field_validator, model_validator

# Tokens of generation (Σ n × max_tokens) a tenant may have in flight on one API process, by tier:
# the free tier fits one request of 8 choices at the default max_tokens twice over.
DEFAULT_TOKENS_IN_FLIGHT_BY_TIER: dict[str, int] = {"free": 4096, "standard": 16384, "premium": 65536}


class ServingSettings(BaseModel):
    inference_max_adapters: int = Field(
        default=8, ge=1, description="Fine-tuned adapters kept loaded on each base model for inference; "
                                     "one more evicts the least recently used.")
    inference_max_base_models: int = Field(
        default=1, ge=1, description="Models kept loaded for inference: base models (with their adapters) and "
                                     "full fine-tunes; one more evicts the least recently used.")
    inference_max_batch: int = Field(
        default=16, ge=1, description="Sequences one loaded model decodes together in each forward pass "
                                      "(continuous batching; adapters of one base mix in a batch). 1: one request "
                                      "at a time.")
    inference_max_queue: int = Field(
        default=256, ge=1, description="Requests that may wait for a loaded model; one more answers 429 with "
                                       "Retry-After.")
    inference_max_queue_per_tenant: int | None = Field(
        default=None, ge=1, description="Of those, how many one tenant's requests may be (default: half the "
                                        "queue). Waiting requests are admitted round-robin over tenants.")
    inference_default_max_tokens: int = Field(
        default=256, ge=1, description="Completion tokens of each choice when a request sets no max_tokens (the "
                                       "model's context still ends it sooner when the prompt leaves less room).")
    inference_max_tokens_per_request: int = Field(
        default=4096, ge=1, description="Largest max_tokens (or max_completion_tokens) a request may ask for each "
                                        "choice; more answers 400. The model's context also caps it.")
    inference_tokens_in_flight_by_tier: dict[str, PositiveInt] = Field(
        default_factory=lambda: dict(DEFAULT_TOKENS_IN_FLIGHT_BY_TIER),
        description="Tokens of generation a tenant may have in flight on one API process, by tier (JSON): the sum "
                    "of n × max_tokens over its queued and running inference requests. A request asking more than "
                    "is left answers 429 tokens_in_flight_exceeded with Retry-After; one asking more than the whole "
                    "bound answers 400 max_tokens_over_budget. A tier not listed gets the free tier's bound. Each "
                    "API worker process has its own engine: with W workers a tenant holds up to W times this.")
    inference_device: str = Field(
        default="auto", description="Device of inference models: 'auto' (cuda if available, else cpu), "
                                    "'cpu', 'cuda' or 'cuda:N'.")
    route_request_retention_days: float = Field(
        default=30.0, gt=0, description="How long the requests an A/B route served are kept for its stats and "
                                        "feedback (docs/serving.md).")
    vllm_urls: dict[str, list[str]] = Field(
        default_factory=dict,
        description='vLLM servers by base model name (JSON), e.g. {"qwen2.5-7b-instruct": '
                    '["http://vllm-0:8000", "http://vllm-1:8000"]}. Each runs that base (its --served-model-name '
                    'is the name here) with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True. Adapters of '
                    'that base in production, or with weight in a route, are loaded into every server, and '
                    'requests for them (and for the base) are sent there (docs/serving.md). Operator-set: the '
                    'egress policy does not apply.')
    vllm_adapter_dir: Path | None = Field(
        default=None, description="Where adapters handed to vLLM are written: a directory the vLLM servers also "
                                  "mount. Default: HOME/vllm-adapters.")
    vllm_adapter_dir_on_server: str | None = Field(
        default=None, description="That directory as the vLLM servers see it (default: the same path).")
    vllm_api_key: str | None = Field(default=None, description="The vLLM servers' --api-key, if they have one.")
    vllm_timeout_s: float = Field(
        default=60.0, gt=0, description="Longest wait for a vLLM server to answer (a load, or a response's next "
                                        "bytes).")
    vllm_sync_interval_s: float = Field(
        default=30.0, gt=0, description="How often the scheduler checks that every vLLM server has the adapters "
                                        "it should (a restarted server has none) and unloads the ones it should "
                                        "not.")

    def inference_tokens_in_flight_for(self, tier: str) -> int:
        """A tenant of `tier`'s bound on tokens in flight per process (the free tier's for an unlisted tier)."""
        bounds = self.inference_tokens_in_flight_by_tier
        return bounds.get(tier, bounds.get("free", DEFAULT_TOKENS_IN_FLIGHT_BY_TIER["free"]))

    @model_validator(mode="after")
    def _default_within_the_cap(self):  # noqa: ANN202 - pydantic's after-validator returns the model
        if self.inference_default_max_tokens > self.inference_max_tokens_per_request:
            raise ValueError(f"inference_default_max_tokens ({self.inference_default_max_tokens}) is more than "
                             f"inference_max_tokens_per_request ({self.inference_max_tokens_per_request})")
        return self

    @field_validator("vllm_urls", mode="before")
    @classmethod
    def _vllm_servers(cls, value: object) -> object:
        """One URL may stand for a list of one; every URL is http(s), kept without a trailing '/'."""
        if not isinstance(value, dict):
            return value
        servers: dict[str, list[str]] = {}
        for base, urls in value.items():
            listed = [urls] if isinstance(urls, str) else urls
            if not isinstance(listed, list) or not listed:
                raise ValueError(f"vllm_urls[{base!r}] must be a URL or a list of URLs")
            for url in listed:
                if not isinstance(url, str) or not url.startswith(("http://", "https://")):
                    raise ValueError(f"vllm_urls[{base!r}]: {url!r} is not an http(s) URL")
            servers[str(base)] = [url.rstrip("/") for url in listed]
        return servers
