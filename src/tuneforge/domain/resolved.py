"""What the platform resolved for a job (`ResolvedJob`): every "auto" of the request
replaced by a value, the prepared dataset, the resources, the cost estimate and the
checkpoint, divergence and eval policies.

It is written once, when the job is validated (services/training/validation.py), kept on the
job row through one codec (`ResolvedJob.to_json` / `ResolvedJob.from_json`, which
db/tables.py applies to the `jobs.resolved` column) and read by attribute everywhere
else. Every type here is frozen: a change, such as a smaller micro-batch after the
trainer ran out of memory, is a new value (`dataclasses.replace`) assigned to the row.

`from_json` reads every row written so far. The keys are the ones the platform has
always written; a missing key takes its field's default (rows of older versions,
partial rows built by tests) and an unknown key is ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, TypeVar

from tuneforge.domain.spec import CheckpointPolicy, Hyperparameters, LoraConfig

_T = TypeVar("_T")


@dataclass(frozen=True)
class ResolvedResources:
    """The GPUs a job runs on, as planned."""

    gpus: int = 1
    """GPUs for the job: as asked, else as many as the memory model says it needs."""
    gpus_per_node: int = 0
    """GPUs on each node of a job spread over several nodes; 0: every GPU on one node."""
    gpu_type: str = "default"
    """GPU type the job runs on: the request's, else the platform's (TUNEFORGE_GPU_TYPE)."""
    gpu_memory_gb: float = 80.0
    """Memory of one GPU the job was planned for."""
    required_gpu_type: str = ""
    """GPU type the job must run on, as the request asked (resources.gpu_type); "": any (the platform's
    TUNEFORGE_GPU_TYPE prices a job, it does not restrict where it runs)."""
    min_gpu_memory_gb: float = 0.0
    """Least memory per GPU the job runs on, in nominal GB (planning/hardware.py): what it asked
    (resources.gpu_memory_gb, or a type's suffix such as a100-80gb) or what the plan needs per GPU (memory
    model, planned micro-batch and sharding), whichever is larger; 0: any."""
    gradient_checkpointing: bool = False
    """The trainer recomputes activations so that a step fits (QLoRA, or a job that needs it to fit)."""
    strategy: str = ""
    """How several GPUs share the job: "ddp" (each holds the model) or "fsdp" (sharded); "" on one GPU."""
    capacity: str = ""
    """auto, spot or on_demand as asked; "": as the tenant's tier says (planning/pools.py)."""
    deadline: float | None = None
    """Unix seconds the job should finish by."""
    max_price: float | None = None
    """Most it pays per GPU-hour."""
    shared_pool: bool = False
    """Trains as a client of its base model's shared co-training worker (no GPUs of its own): a small
    LoRA job within the operator's pool limits (TUNEFORGE_POOL_JOBS_MAX_*; train/pool_client.py)."""


@dataclass(frozen=True)
class ResolvedData:
    """The prepared (normalised, checked, split) dataset the trainer reads, and the data
    options it was prepared with."""

    dataset_id: str | None = None
    """Id of the prepared dataset (shared by jobs with the same files, base model and options)."""
    train_key: str | None = None
    """Object-store key of the prepared training set; None: the uploaded file's."""
    valid_key: str | None = None
    """Object-store key of the prepared validation set; None: no validation set."""
    train_examples: int = 0
    """Examples in the training set."""
    valid_examples: int = 0
    """Examples in the validation set."""
    train_tokens: int = 0
    """Tokens of one pass over the training set."""
    format: str | None = None
    """File format the tenant forced (jsonl, csv, parquet, hf_dataset); None: detected."""
    remove_duplicates: bool = False
    """Exact and near duplicates were dropped before training."""
    near_duplicate_threshold: float = 0.9
    """Jaccard similarity of character 5-grams above which two examples are near duplicates."""
    contamination_threshold: float = 0.5
    """Share of an example's 13-grams found in an eval set that flags it as contaminated."""
    pii_policy: str = "warn"
    """What was done with personal data and secrets: warn, redact or reject."""
    long_examples: str = "truncate"
    """Examples over max_seq_length: truncate (keep the first tokens) or reject."""
    validation_split: float | None = None
    """Share of the training examples held out for validation when no validation file was given."""


@dataclass(frozen=True)
class Estimate:
    """The job's cost before it runs (services/training/estimates.py); the field order is the API's."""

    training_tokens: int = 0
    """Tokens trained on over every epoch."""
    train_examples: int = 0
    """Examples in the training set."""
    steps: int = 0
    """Optimizer steps over every epoch."""
    estimated_runtime_seconds: float = 0.0
    """Wall-clock training time, from a FLOP count and the GPUs' sustained throughput."""
    estimated_gpu_hours: float = 0.0
    """Runtime times GPUs, in hours."""
    gpu_type: str = "default"
    """GPU type the price is for."""
    gpus: int = 1
    """GPUs the estimate assumes."""
    price_per_gpu_hour: float = 0.0
    """The operator's price of one hour of one such GPU."""
    estimated_price: float = 0.0
    """GPU-hours times the price per GPU-hour."""
    currency: str = "USD"
    """Currency of the prices."""


@dataclass(frozen=True)
class DivergencePolicy:
    """When the trainer stops a run whose loss ran away (`training_diverged`)."""

    loss_multiple: float = 4.0
    """Stop when the smoothed training loss stays above this multiple of its lowest value ..."""
    patience_steps: int = 20
    """... for this many optimizer steps in a row ..."""
    min_increase: float = 1.0
    """... and is at least this many nats above the lowest value, so that tiny losses can settle."""


@dataclass(frozen=True)
class ResolvedGate:
    """A condition the fine-tuned model must meet to be promotable (eval/gates.py)."""

    metric: str
    """A result key, e.g. golden.loss, safety.refusal_rate, task.exact_match."""
    op: str
    """How the value compares with the threshold: <, <=, >, >= or ==."""
    threshold: float
    """The bound the value is compared with."""
    relative_to_base: bool = False
    """Compare the difference fine-tuned minus base instead of the fine-tuned value."""


@dataclass(frozen=True)
class ResolvedEval:
    """Post-training evaluation with the platform's defaults filled in (services/training/evaluation.py).
    The trainer gets it in its spec (`JobSpec.eval`); the gates are checked
    by the control plane."""

    enabled: bool = True
    """Evaluate after training; false skips every eval."""
    task_file: str | None = None
    """Id of the tenant's file of task examples; None: no task eval."""
    metrics: tuple[str | Mapping[str, Any], ...] | None = None
    """Task metrics: names or objects (e.g. {"type": "regex", ...}); None without a task file."""
    gates: tuple[ResolvedGate, ...] = ()
    """The gates the model must pass: the tenant's, else the platform's golden-set and safety gates."""
    golden: bool = True
    """Run the platform's general-ability (golden) set."""
    safety: bool = True
    """Run the platform's harmful-prompt set and measure refusals."""
    safety_detector: str | Mapping[str, Any] | None = None
    """Refusal detector: "keywords", or {"type": "guard_model", ...}; None: keywords."""
    max_new_tokens: int = 64
    """Tokens generated per task or safety prompt."""
    max_examples: int = 200
    """Task and validation examples evaluated at most."""
    task_file_key: str | None = None
    """Object-store key of the task file (not shown to the tenant); None: no task file."""
    benchmarks: tuple[str, ...] = ()
    """Benchmark tasks run base vs fine-tuned (names in the operator's benchmark folder)."""
    benchmark_dir: str | None = None
    """The operator's benchmark folder the trainer reads the tasks from (not shown to the tenant)."""
    benchmark_batch_size: int = 16
    """Sequences per forward pass when benchmark tasks are scored."""

    def to_json(self) -> dict[str, Any]:
        return {
            "enabled": self.enabled,
            "task_file": self.task_file,
            "metrics": list(self.metrics) if self.metrics is not None else None,
            "gates": [asdict(gate) for gate in self.gates],
            "golden": self.golden,
            "safety": self.safety,
            "safety_detector": self.safety_detector,
            "max_new_tokens": self.max_new_tokens,
            "max_examples": self.max_examples,
            "task_file_key": self.task_file_key,
            # only when benchmarks run, so rows written before them read back unchanged
            **({"benchmarks": list(self.benchmarks), "benchmark_dir": self.benchmark_dir,
                "benchmark_batch_size": self.benchmark_batch_size} if self.benchmarks else {}),
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> ResolvedEval:
        known = _known(cls, raw)
        if known.get("metrics") is not None:
            known["metrics"] = tuple(known["metrics"])
        known["gates"] = tuple(_build(ResolvedGate, gate) for gate in known.get("gates") or ())
        known["benchmarks"] = tuple(known.get("benchmarks") or ())
        return cls(**known)


@dataclass(frozen=True)
class ResolvedJob:
    """Everything the platform decided for a job: what the trainer runs, the plan the
    scheduler places, the policies the control plane applies."""

    method: str = "supervised"
    """Training method: supervised, dpo, orpo or cpt."""
    training_type: str = "lora"
    """What is trained: lora, qlora (adapters) or full (every weight)."""
    hyperparameters: Hyperparameters = field(default_factory=Hyperparameters)
    """Resolved hyperparameters: no "auto" left; the micro-batch may shrink after an out-of-memory retry."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """Adapter settings (rank, alpha, dropout, target modules); unused by a full fine-tune."""
    checkpoint: CheckpointPolicy = field(default_factory=CheckpointPolicy)
    """How often checkpoints are written and how many are kept."""
    resources: ResolvedResources = field(default_factory=ResolvedResources)
    """GPUs the job runs on."""
    num_examples: int = 0
    """Examples in the training set (the same as `data.train_examples`)."""
    data: ResolvedData = field(default_factory=ResolvedData)
    """The prepared dataset and the data options."""
    estimate: Estimate | None = None
    """Cost estimate made when the job was planned; None on rows that have none."""
    divergence: DivergencePolicy | None = None
    """When the trainer stops a diverging run; None: the platform's settings."""
    eval: ResolvedEval | None = None
    """Post-training evaluation and gates; None: none was resolved (the job is not evaluated)."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Options passed to the trainer as they are (`JobSpec.extra`), such as test hooks."""

    @property
    def gpus(self) -> int:
        """GPUs for the job (`resources.gpus`)."""
        return self.resources.gpus

    def to_json(self) -> dict[str, Any]:
        """The stored form, what `from_json` reads: the keys rows have always had (same names and
        values), plus method, training_type and extra."""
        return {
            "method": self.method,
            "training_type": self.training_type,
            "hyperparameters": asdict(self.hyperparameters),
            "lora": asdict(self.lora),
            "checkpoint": asdict(self.checkpoint),
            "gpus": self.gpus,
            "resources": asdict(self.resources),
            "num_examples": self.num_examples,
            "data": asdict(self.data),
            "estimate": asdict(self.estimate) if self.estimate is not None else None,
            "divergence": asdict(self.divergence) if self.divergence is not None else None,
            "eval": self.eval.to_json() if self.eval is not None else None,
            "extra": dict(self.extra),
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> ResolvedJob:
        """Any stored row: the current form, an older one, or a partial one (missing keys take defaults)."""
        resources = dict(raw.get("resources") or {})
        if raw.get("gpus") is not None:
            resources.setdefault("gpus", raw["gpus"])  # rows keep the GPU count at the top level too
        scalars = {key: raw[key] for key in ("method", "training_type", "num_examples") if raw.get(key) is not None}
        return cls(
            **scalars,
            # from_dict also moves a method's own values of older rows (a top-level beta) into method_options
            hyperparameters=Hyperparameters.from_dict(
                {k: v for k, v in (raw.get("hyperparameters") or {}).items() if v is not None}),
            lora=_build(LoraConfig, raw.get("lora")),
            # a row from before epoch checkpoints: its trainer kept the newest, whatever the epoch
            checkpoint=_build(CheckpointPolicy, {"every_epoch": False, **raw["checkpoint"]}
                              if isinstance(raw.get("checkpoint"), Mapping) else None),
            resources=_build(ResolvedResources, resources),
            data=_build(ResolvedData, raw.get("data")),
            estimate=_build(Estimate, raw["estimate"]) if raw.get("estimate") else None,
            divergence=_build(DivergencePolicy, raw["divergence"]) if raw.get("divergence") else None,
            eval=ResolvedEval.from_json(raw["eval"]) if raw.get("eval") else None,
            extra=dict(raw.get("extra") or {}),
        )


def _known(cls: type, raw: Mapping[str, Any] | None) -> dict[str, Any]:
    """The entries of `raw` that are fields of the dataclass `cls` (None values take the default)."""
    names = {f.name for f in fields(cls)}
    return {key: value for key, value in (raw or {}).items() if key in names and value is not None}


def _build(cls: type[_T], raw: Mapping[str, Any] | None) -> _T:
    return cls(**_known(cls, raw))
