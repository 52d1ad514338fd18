"""JobSpec: everything one trainer attempt needs, serialised as JSON.

The control plane writes it; `python -m tuneforge.train SPEC` reads it. The
trainer never touches the database: data and models come from the object
store, reports go to `callback_url` with `job_token`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tuneforge.domain.resolved import ResolvedEval


@dataclass(frozen=True)
class BaseModelRef:
    name: str
    sha256: str
    prefix: str  # object-store prefix holding config, weights and tokenizer
    # what the base was registered from (a hub id, or the path on the control plane's host): what
    # an exported adapter names as its base, for loaders elsewhere
    source: str = ""


@dataclass(frozen=True)
class DataFileRef:
    file_id: str
    key: str  # object-store key of the uploaded file
    sha256: str = ""


@dataclass(frozen=True)
class LoraConfig:
    rank: int = 8
    alpha: int | float = 16  # an int unless a tenant asked for a fractional one
    dropout: float = 0.0
    target_modules: list[str] | str = "all-linear"


@dataclass(frozen=True)
class Hyperparameters:
    """Resolved values (no 'auto' left)."""

    n_epochs: int = 3
    batch_size: int = 8  # effective batch: micro_batch_size * gradient_accumulation_steps
    micro_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    learning_rate: float = 2e-4
    learning_rate_multiplier: float = 1.0
    warmup_ratio: float = 0.0
    lr_scheduler_type: str = "linear"
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    max_seq_length: int = 2048
    train_on_inputs: bool = False
    packing: bool = True  # micro-batches are rows of packed examples (block-diagonal attention)
    # the method's own resolved hyperparameters (e.g. DPO's beta), read only by that method's module
    method_options: dict[str, Any] = field(default_factory=dict)

    def flat(self) -> dict[str, Any]:
        """The shared values and the method's own side by side, as the job object shows them."""
        shared = {name: getattr(self, name) for name in self.__dataclass_fields__ if name != "method_options"}
        return {**shared, **self.method_options}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Hyperparameters:
        """Also reads values written before methods had options of their own (a top-level `beta`)."""
        known = set(cls.__dataclass_fields__)
        options = {**{k: v for k, v in raw.items() if k not in known}, **(raw.get("method_options") or {})}
        return cls(**{k: v for k, v in raw.items() if k in known and k != "method_options"}, method_options=options)


@dataclass(frozen=True)
class CheckpointPolicy:
    every_steps: int = 50
    keep_last: int = 3
    every_minutes: float = 0.0  # also checkpoint when this long has passed since the last one (0: off)
    every_epoch: bool = True  # also checkpoint at the end of every epoch; retention then counts epochs
    keep_on_cancel: bool = False  # a cancelled job keeps its checkpoints


# The method of a co-training pool's job (services/training_api/scheduled.py): its attempt runs the
# training API's worker for one base model (train/cotrain_worker.run_pool_attempt), not a training loop.
POOL_METHOD = "cotrain_pool"


@dataclass(frozen=True)
class JobSpec:
    job_id: str
    tenant_id: str
    attempt: int
    seed: int
    base_model: BaseModelRef
    training_file: DataFileRef
    validation_file: DataFileRef | None
    method: str  # a registered training method (`tuneforge.methods`)
    training_type: str  # "lora"
    lora: LoraConfig
    hyperparameters: Hyperparameters
    checkpoint: CheckpointPolicy
    storage_url: str
    callback_url: str
    job_token: str
    gpus: int = 0
    heartbeat_interval_s: float = 5.0
    cache_dir: str = ""  # local folder for base-model copies, keyed by SHA
    fine_tuned_model: str = ""
    preempt_grace_s: float = 90.0  # after SIGTERM: checkpoint and exit within this
    divergence_loss_multiple: float = 4.0
    divergence_patience_steps: int = 20
    divergence_min_increase: float = 1.0  # nats: a near-zero best loss times a multiple is still near zero
    gradient_checkpointing: bool = False  # recompute activations in the backward pass (the memory model asked)
    fused_loss: str = "auto"  # token losses without the logits: auto, chunked, liger or off (train/fused_loss.py)
    grader_python: str = "/usr/bin/python3"  # the interpreter python graders run with, in the sandbox (operator's)
    grader_embeddings: str = ""  # the operator's endpoint (by name) answering the cosine metric; "": none
    grader_timeout_s: float = 5.0  # wall time of a python grader on one sample (operator's)
    rollout_vllm_memory: float = 0.0  # GPU memory fraction for reinforcement rollouts on vLLM; 0: the trainer's
    distributed_strategy: str = ""  # several GPUs: "ddp" or "fsdp" (train/distributed.py); "": by training type
    cpu_threads: int = 0  # CPU intra-op threads; 0: chosen by the model's size
    eval: ResolvedEval | None = None  # post-training evaluation (`train/evaluate.py`); None: none
    shared_pool: bool = False  # its steps run on its base's shared co-training worker (train/pool_client.py)
    init_adapter_prefix: str = ""  # a continued job: the adapter (its parent's) it starts from
    integrations: list[dict[str, Any]] = field(default_factory=list)  # experiment trackers (train/tracking.py)
    extra: dict[str, Any] = field(default_factory=dict)  # injected faults for tests (`train/hooks.py`)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    def write(self, path: Path) -> None:
        Path(path).write_text(self.to_json())

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> JobSpec:
        raw = dict(raw)
        raw["base_model"] = BaseModelRef(**raw["base_model"])
        raw["training_file"] = DataFileRef(**raw["training_file"])
        if raw.get("validation_file"):
            raw["validation_file"] = DataFileRef(**raw["validation_file"])
        raw["lora"] = LoraConfig(**raw["lora"])
        raw["hyperparameters"] = Hyperparameters.from_dict(raw["hyperparameters"])
        raw["checkpoint"] = CheckpointPolicy(**raw["checkpoint"])
        extra = dict(raw.get("extra") or {})
        for name in ("gradient_checkpointing", "cpu_threads", "eval"):  # where specs of older releases kept them
            if name in extra and name not in raw:
                raw[name] = extra.pop(name)
        raw["extra"] = extra
        if raw.get("eval"):
            from tuneforge.domain.resolved import ResolvedEval  # resolved.py builds on this module's types

            raw["eval"] = ResolvedEval.from_json(raw["eval"])
        raw["cpu_threads"] = int(raw.get("cpu_threads") or 0)
        return cls(**raw)

    @classmethod
    def read(cls, path: Path) -> JobSpec:
        return cls.from_dict(json.loads(Path(path).read_text()))
