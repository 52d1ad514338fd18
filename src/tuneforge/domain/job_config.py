"""What a tenant asks of a fine-tuning job (`JobRequest`, the create body):
OpenAI's fields plus tuneforge's extensions.

Every model forbids unknown keys, so a typo answers 400 naming the key instead
of being silently ignored, and is frozen: a request is what was asked, never
edited afterwards. Field descriptions are the documentation. Which method a
request asks for and where its hyperparameters are is decided here, by
`JobRequest.method_type` and `JobRequest.asked_hyperparameters`, and
nowhere else (the method registry then types the values).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tuneforge.domain.vocab import DataFormat, Strategy, TrainingTypeName

Auto = Literal["auto"]


# Bounds on what a body may hold, so that the API refuses with 400 what no job needs.
_ID_CHARS = 256
_LIST_ITEMS = 64
_NAME = Field(max_length=_ID_CHARS)


class _Strict(BaseModel):
    # 1e400 parses as infinity: every float is finite
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class SupervisedHyperparameters(_Strict):
    n_epochs: int | Auto = Field("auto", description="Passes over the training data (1-50).")
    batch_size: int | Auto = Field("auto", description="Examples per optimizer step (1-256).")
    learning_rate_multiplier: float | Auto = Field(
        "auto", description="Scales the method's default learning rate."
    )
    learning_rate: float | Auto | None = Field(
        None, description="Absolute learning rate; overrides the multiplier."
    )
    warmup_ratio: float | Auto = Field("auto", description="Fraction of steps of linear warmup (0-0.5).")
    lr_scheduler_type: Literal["linear", "cosine", "constant"] | Auto = Field(
        "auto", description="Learning-rate decay after warmup."
    )
    weight_decay: float | Auto = Field("auto", description="AdamW weight decay.")
    max_grad_norm: float | Auto = Field("auto", description="Gradient clipping norm (0 disables).")
    max_seq_length: int | Auto = Field(
        "auto", description="Tokens per example; longer examples are truncated from the end."
    )
    train_on_inputs: bool | Auto = Field(
        "auto", description="Also compute the loss on system/user/prompt tokens."
    )
    gradient_accumulation_steps: int | Auto = Field(
        "auto", description="Micro-batches per optimizer step; micro-batch = batch_size / this."
    )
    packing: bool | Auto = Field(
        "auto", description="Pack a step's examples into max_seq_length rows (attention never crosses examples)."
    )


class MethodBlock(_Strict):
    hyperparameters: dict[str, Any] = Field(
        default_factory=dict, description="The method's hyperparameters: the shared ones above plus its own "
                                          "(docs/methods.md); checked against the method at creation.")
    grader: dict[str, Any] | None = Field(None, description="reinforcement: the grader that scores each sample "
                                                          "(OpenAI's grader objects, docs/rft.md).")
    response_format: dict[str, Any] | None = Field(
        None, description="reinforcement: a JSON schema the samples follow ({type: json_schema, json_schema: "
                          "{name, schema}}); graders then read sample.output_json.")

    @model_validator(mode="after")
    def _beside_hyperparameters(self) -> MethodBlock:
        for name in BLOCK_FIELDS:
            if name in self.hyperparameters:
                raise ValueError(f"{name} belongs in the method block, beside hyperparameters, not inside them")
        return self

    def block_fields(self) -> dict[str, Any]:
        """The block's values beside its hyperparameters (a grader, a response format) that it holds."""
        return {name: getattr(self, name) for name in BLOCK_FIELDS if getattr(self, name) is not None}


# What a method block may hold beside its hyperparameters; the method's model takes them as its options.
BLOCK_FIELDS = ("grader", "response_format")


class Method(BaseModel):
    """`{"type": NAME, NAME: {"hyperparameters": {...}}}` as OpenAI's API has it; NAME is a
    registered training method (`tuneforge.methods`), whose own model checks the block."""

    model_config = ConfigDict(extra="allow", frozen=True, allow_inf_nan=False)
    type: str = Field("supervised", max_length=64, description="The training method.")

    @model_validator(mode="after")
    def _one_block(self) -> Method:
        extra = self.model_extra or {}
        for key, value in extra.items():
            if key != self.type:
                raise ValueError(f"the method block must be named after method.type ({self.type!r}), not {key!r}")
            extra[key] = MethodBlock.model_validate(value)
        return self

    @property
    def block(self) -> MethodBlock | None:
        """The chosen method's block, when the body has one."""
        return (self.model_extra or {}).get(self.type)


class TrainingType(_Strict):
    type: TrainingTypeName = Field("lora", description="Adapter or full fine-tune.")
    rank: int | Auto = Field("auto", description="LoRA rank r.")
    alpha: float | Auto = Field("auto", description="LoRA alpha; default 2 x rank.")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="LoRA dropout.")
    target_modules: list[str] | Literal["all-linear"] = Field(
        "all-linear", description="Module names to adapt; default every linear layer but the head."
    )


class Checkpointing(_Strict):
    every_steps: int | None = Field(None, ge=1, le=2**31 - 1, description="Checkpoint every N optimizer steps.")
    keep_last: int | None = Field(None, ge=1, le=100, description="Checkpoints kept: of epoch ends when "
                                                                      "every_epoch (plus the newest), else the newest.")
    every_epoch: bool | None = Field(None, description="Checkpoint at the end of every epoch, as OpenAI does "
                                                        "(default true).")
    every_minutes: float | None = Field(None, gt=0, le=1440, description="Also checkpoint every M minutes.")
    keep_on_cancel: bool | None = Field(None, description="Keep the checkpoints when the job is cancelled.")


class Divergence(_Strict):
    loss_multiple: float | None = Field(
        None, gt=1.0, le=1000.0, description="Stop when the smoothed loss stays above this multiple of its best.")
    patience_steps: int | None = Field(None, ge=1, le=100_000, description="... for this many steps in a row.")
    min_increase: float | None = Field(
        None, ge=0.0, le=100.0, description="... and at least this much above it (nats), so tiny losses can settle.")


class Resources(_Strict):
    gpus: int | None = Field(None, ge=1, le=1024, description="GPUs for the job; default from model size.")
    gpu_type: str | None = Field(None, max_length=64, description="GPU type, e.g. a100-80gb.")
    gpu_memory_gb: float | None = Field(None, gt=0, le=1024, description="Least memory per GPU.")
    nodes: int | None = Field(
        None, ge=1, le=256, description="Nodes the GPUs are spread over, the same number on each: 1 keeps every "
                                        "GPU on one node (the job waits rather than split); default: one node up to "
                                        "TUNEFORGE_GPUS_PER_NODE GPUs, whole nodes of that size above.")
    capacity: Literal["auto", "spot", "on_demand"] | None = Field(
        None, description='Where it may run when the platform has capacity pools: "spot" (cheap, preemptible; '
                          'resumed from checkpoints), "on_demand", or "auto": spot while it can still meet the '
                          "deadline, then on-demand. Default: by the tenant's tier (docs/scheduling.md).")
    deadline: int | None = Field(None, ge=0, le=2**53, description="Unix seconds it should finish by (auto "
                                                                   "capacity keeps it met).")
    max_price: float | None = Field(None, gt=0, le=1e6, description="Most it pays per GPU-hour: pools above "
                                                                    "it are not used.")


class Distributed(_Strict):
    strategy: Strategy | None = Field(
        None, description='How several GPUs share the job: "ddp" (each GPU holds the whole model, gradients '
                          'are all-reduced) or "fsdp" (weights, gradients and optimizer states sharded with '
                          'FSDP2); default: "fsdp" for full fine-tunes and bases that do not fit one GPU, else '
                          '"ddp". QLoRA cannot be sharded.')


class DataOptions(_Strict):
    format: DataFormat | None = Field(
        None, description="Force the file format instead of detecting it.")
    remove_duplicates: bool = Field(False, description="Drop exact and near duplicates before training.")
    near_duplicate_threshold: float = Field(0.9, ge=0.5, le=1.0, description="Jaccard of character 5-grams.")
    contamination_threshold: float = Field(
        0.5, gt=0.0, le=1.0, description="Share of an example's 13-grams found in an eval set that flags it.")
    pii_policy: Literal["warn", "redact", "reject"] | None = Field(
        None, description="What to do with personal data and secrets; default: the tenant's policy (warn).")
    long_examples: Literal["truncate", "reject"] = Field(
        "truncate", description="Examples over max_seq_length keep their first tokens, or fail the job.")
    validation_split: float | None = Field(
        None, gt=0.0, le=0.5, description="Without a validation file: share of examples held out, by seed.")


_BENCHMARK_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$"  # eval/benchmarks.NAME_PATTERN


class EvalGate(_Strict):
    metric: str = Field(max_length=_ID_CHARS,
                        description="A result key, e.g. golden.loss, safety.refusal_rate, task.exact_match.")
    op: Literal["<", "<=", ">", ">=", "=="] = Field(description="How the value compares with the threshold.")
    threshold: float = Field(description="The bound the value is compared with.")
    relative_to_base: bool = Field(
        False, description="Compare fine-tuned minus base (a difference) instead of the fine-tuned value.")
    max_regression_points: float | None = Field(
        None, ge=0, description="For benchmark:<task>: the fine-tuned score may fall at most this many points "
                                "below the base model's (instead of op and threshold).")

    @model_validator(mode="before")
    @classmethod
    def _points(cls, raw: Any) -> Any:
        """`max_regression_points: N` reads as op >=, threshold -N, relative to the base."""
        if not isinstance(raw, dict) or raw.get("max_regression_points") is None:
            return raw
        if any(key in raw for key in ("op", "threshold", "relative_to_base")):
            raise ValueError("give max_regression_points or op/threshold/relative_to_base, not both")
        points = raw["max_regression_points"]
        bound = -points if isinstance(points, (int, float)) and not isinstance(points, bool) else points
        rest = {key: value for key, value in raw.items() if key != "max_regression_points"}
        return {**rest, "op": ">=", "threshold": bound, "relative_to_base": True}


class EvalConfig(_Strict):
    enabled: bool = Field(True, description="Evaluate after training (status evaluating); false skips every eval.")
    task_file: str | None = Field(
        None, max_length=_ID_CHARS, description="Id of an uploaded file of chat (or prompt/completion) examples: "
                          "the model's answer to "
                          "each prompt is scored against the last assistant turn by `metrics`.")
    metrics: list[str | dict] | None = Field(
        None, max_length=_LIST_ITEMS, description='Task metrics: names or objects, e.g. ["exact_match", '
                          '{"type": "regex", "pattern": '
                          '"^\\d+$"}, {"type": "llm_judge", "endpoint": "http://judge/v1", "model": "m"}]; '
                          'default ["exact_match", "rouge_l"].')
    gates: list[EvalGate] | None = Field(
        None, max_length=_LIST_ITEMS, description="Conditions the fine-tuned model must meet to be promotable; "
                          "default: the platform's "
                          "golden-set and safety gates.")
    golden: bool = Field(True, description="Run the platform's general-ability (golden) set.")
    safety: bool = Field(True, description="Run the platform's harmful-prompt set and measure refusals.")
    safety_detector: str | dict | None = Field(
        None, description='Refusal detector: "keywords" (default) or {"type": "guard_model", "endpoint", "model"}.')
    max_new_tokens: int = Field(64, ge=1, le=2048, description="Tokens generated per task or safety prompt.")
    max_examples: int = Field(200, ge=1, le=10_000, description="Task and validation examples evaluated at most.")
    benchmarks: list[Annotated[str, Field(pattern=_BENCHMARK_NAME)]] | None = Field(
        None, max_length=_LIST_ITEMS, description="Benchmark tasks to run, base vs fine-tuned (names of the "
                          "operator's lm-eval-format tasks; scores in points 0-100 as benchmark:<task>); "
                          "default the operator's TUNEFORGE_BENCHMARK_TASKS, [] runs none.")


_SECRET_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"  # services/secrets.NAME_PATTERN


class WandbIntegration(_Strict):
    project: str = Field(min_length=1, max_length=128, description="The W&B project the run is logged to.")
    name: str | None = Field(None, max_length=128, description="The run's display name; default the job id.")
    entity: str | None = Field(None, max_length=128, description="The W&B team or user; default the key's own.")
    tags: list[Annotated[str, Field(min_length=1, max_length=64)]] | None = Field(
        None, max_length=50, description="Tags on the run, besides tuneforge/finetune, tuneforge/{base model} "
                                         "and tuneforge/{job id}.")
    api_key_secret: str | None = Field(
        None, pattern=_SECRET_NAME, description="Extension: the tenant secret holding the W&B API key; default "
                                                "the secret named WANDB_API_KEY.")


class MlflowIntegration(_Strict):
    tracking_uri: str | None = Field(
        None, max_length=2048, description="An http(s) MLflow tracking server (it passes the egress policy); "
                                           "default the operator's (TUNEFORGE_MLFLOW_TRACKING_URI).")
    experiment_name: str = Field("tuneforge", min_length=1, max_length=256,
                                 description="The experiment the run goes to (made when missing).")
    run_name: str | None = Field(None, max_length=256, description="The run's name; default the job id.")
    tags: dict[Annotated[str, Field(min_length=1, max_length=250)],
               Annotated[str, Field(max_length=5000)]] | None = Field(
        None, max_length=50, description="Tags on the run, besides tuneforge.job_id and tuneforge.base_model.")
    token_secret: str | None = Field(None, pattern=_SECRET_NAME,
                                     description="Tenant secret holding a bearer token for tracking_uri.")
    username_secret: str | None = Field(None, pattern=_SECRET_NAME,
                                        description="Tenant secret holding the basic-auth user for tracking_uri.")
    password_secret: str | None = Field(None, pattern=_SECRET_NAME,
                                        description="Tenant secret holding the basic-auth password for tracking_uri.")


class Integration(_Strict):
    type: str = Field(max_length=_ID_CHARS, description="wandb (OpenAI's), or the extensions tensorboard and mlflow.")
    wandb: WandbIntegration | None = None
    tensorboard: dict | None = Field(None, description="No settings: event files beside the job's artifacts.")
    mlflow: MlflowIntegration | None = None


class LockedFile(_Strict):
    id: str = Field(max_length=_ID_CHARS)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class LockedModel(_Strict):
    name: str = Field(max_length=_ID_CHARS)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class JobLock(_Strict):
    """Extension: what a re-run must find unchanged (written by GET …/export and `tuneforge jobs
    export`): the base model's and the data files' SHA-256. A mismatch answers 400 naming it."""
    base_model: LockedModel
    training_file: LockedFile
    validation_file: LockedFile | None = None
    config_hash: str | None = Field(None, max_length=_ID_CHARS, description="The exported job's, for reference.")
    exported_from: str | None = Field(None, max_length=_ID_CHARS, description="The exported job's id.")
    tuneforge_version: str | None = Field(None, max_length=_ID_CHARS)


# Together's names of the adapter's settings -> training_type's
TOGETHER_LORA_NAMES = {"lora_r": "rank", "lora_alpha": "alpha", "lora_dropout": "dropout",
                       "lora_trainable_modules": "target_modules"}


class JobRequest(_Strict):
    model: str = Field(max_length=_ID_CHARS, description="Base model name (see GET /v1/models).")
    training_file: str = Field(max_length=_ID_CHARS, description="Id of an uploaded file with purpose fine-tune.")
    validation_file: str | None = Field(None, max_length=_ID_CHARS)
    suffix: str | None = Field(None, max_length=64)
    seed: int | None = Field(None, ge=0, le=2**31 - 1)
    # at most 16 keys (checked by the service, as OpenAI words it); keys 64 and values 512 characters
    metadata: dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]] | None = Field(
        None, max_length=_LIST_ITEMS)
    hyperparameters: SupervisedHyperparameters | None = Field(
        None, description="Deprecated by OpenAI in favour of method; still accepted."
    )
    method: Method | None = None
    integrations: list[Integration] | None = Field(None, max_length=_LIST_ITEMS)
    training_type: TrainingType | None = None
    checkpointing: Checkpointing | None = None
    divergence: Divergence | None = None
    data: DataOptions | None = None
    resources: Resources | None = None
    distributed: Distributed | None = None
    eval: EvalConfig | None = Field(None, description="Post-training evaluation and gates (docs/eval.md).")
    lock: JobLock | None = Field(None, description="Extension: the base model and data this job must find "
                                                   "unchanged (a re-run of an exported job).")

    @model_validator(mode="before")
    @classmethod
    def _together_names(cls, raw: Any) -> Any:
        """Together's names for the adapter (`lora_r`, `lora_alpha`, `lora_dropout`,
        `lora_trainable_modules`) become `training_type`'s; naming one both ways is refused."""
        if not isinstance(raw, dict) or not any(name in raw for name in TOGETHER_LORA_NAMES):
            return raw
        raw = dict(raw)
        training_type = raw.get("training_type")
        merged = dict(training_type) if isinstance(training_type, dict) else {}
        for name, ours in TOGETHER_LORA_NAMES.items():
            if name not in raw:
                continue
            value = raw.pop(name)
            if ours in merged:
                raise ValueError(f"{name} and training_type.{ours} name the same setting; give one of them")
            if ours == "target_modules" and isinstance(value, str) and value != "all-linear":
                value = [module.strip() for module in value.split(",") if module.strip()]
            merged[ours] = value
        raw["training_type"] = merged
        return raw

    @property
    def method_type(self) -> str:
        """The training method asked for: `method.type`, "supervised" without a method block."""
        return self.method.type if self.method is not None else "supervised"

    @property
    def asked_hyperparameters(self) -> dict[str, Any]:
        """The method's hyperparameters as the tenant wrote them: the method block's
        (`method.<type>.hyperparameters`), else the deprecated top-level `hyperparameters` of a
        supervised job, else none. The method's own model types them
        (`services.hyperparams.requested_hyperparameters`)."""
        block = self.method.block if self.method is not None else None
        if block is not None:
            return {**block.hyperparameters, **block.block_fields()}
        if self.hyperparameters is not None and self.method_type == "supervised":
            return self.hyperparameters.model_dump(exclude_unset=True)
        return {}

    @property
    def effective_training_type(self) -> TrainingType:
        """`training_type` as asked, or the default (a LoRA adapter with "auto" rank and alpha)."""
        return self.training_type or TrainingType()

    @property
    def training_type_kind(self) -> str:
        """What is trained: lora, qlora or full."""
        return self.effective_training_type.type

    def to_json(self) -> dict[str, Any]:
        """The stored form: the fields the tenant gave, as JSON values (what `from_json` reads)."""
        return self.model_dump(mode="json", exclude_unset=True)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> JobRequest:
        return cls.model_validate(raw)
