"""Plan a job: check its data against the base model, prepare the dataset,
resolve every "auto" value and estimate its cost. Used by job validation and
by `POST /v1/fine_tuning/jobs/estimate`, so both give the same figures."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy.orm import Session

from tuneforge import methods
from tuneforge.db.tables import BaseModelRow, FileRow, Tenant
from tuneforge.domain.errors import invalid
from tuneforge.domain.job_config import DataOptions, JobRequest
from tuneforge.domain.resolved import (
    DivergencePolicy,
    Estimate,
    ResolvedData,
    ResolvedEval,
    ResolvedJob,
    ResolvedResources,
)
from tuneforge.domain.spec import CheckpointPolicy, Hyperparameters, LoraConfig
from tuneforge.planning import hyperparams, memory
from tuneforge.planning.hardware import GpuAsk, NodeHardware, nominal_gb, why_nowhere
from tuneforge.planning.hardware import planning_memory_gb as inventory_memory_gb
from tuneforge.services.context import Platform
from tuneforge.services.datasets.checks import PreparedDataset, PrepareRequest, prepare_for_job
from tuneforge.services.datasets.tokenizers import tokenizer_for
from tuneforge.services.training import estimates, eval_sets, graders
from tuneforge.settings import Settings
from tuneforge.storage import layout
from tuneforge.storage.store import ObjectStore


@dataclass
class Plan:
    prepared: PreparedDataset
    method: str
    training_type: str
    hyperparameters: Hyperparameters
    lora: LoraConfig
    data: dict[str, Any]  # the data options, resolved (DataOptions' fields)
    estimate: Estimate
    resources: ResolvedResources

    def resolved(self, checkpoint: CheckpointPolicy, divergence: DivergencePolicy,
                 evaluation: ResolvedEval | None) -> ResolvedJob:
        """What the job row keeps (`jobs.resolved`), with the policies the caller resolved."""
        return ResolvedJob(
            method=self.method,
            training_type=self.training_type,
            hyperparameters=self.hyperparameters,
            lora=self.lora,
            checkpoint=checkpoint,
            resources=self.resources,
            num_examples=self.prepared.train_examples,
            data=ResolvedData(**self.prepared.to_dict(), **self.data),
            estimate=self.estimate,
            divergence=divergence,
            eval=evaluation,
        )


ROLLOUT_ROWS = 64  # sequences a generating method samples at once (train/sampling.py: max_rows)


def rollout_group(method: str, requested: Any) -> int:
    """Completions a generating method samples per example (its group), 0 for other methods."""
    spec = methods.get(method)
    if not spec.generates:
        return 0
    return int(getattr(spec.resolve_options(requested), "group_size", 1))


def completion_tokens(method: str, requested: Any) -> int:
    """Tokens a generating method samples per completion at most, 0 for other methods."""
    spec = methods.get(method)
    return int(getattr(spec.resolve_options(requested), "completion_tokens", 0)) if spec.generates else 0


def plan_job(session: Session, platform: Platform, tenant: Tenant, request: JobRequest, *, seed: int,
             training: FileRow, validation: FileRow | None, base: BaseModelRow, keep_dataset: bool = True) -> Plan:
    """Raises DataCheckFailed (bad data) or ApiError (bad hyperparameters). `keep_dataset=False`: an
    estimate, which writes no prepared dataset (`datasets.prepare_for_job`)."""
    training_type = request.effective_training_type
    requested = hyperparams.requested_hyperparameters(request)
    method = request.method_type
    data = (request.data or DataOptions()).model_dump()
    data["pii_policy"] = data.get("pii_policy") or tenant.pii_policy or "warn"
    max_seq_length = hyperparams.resolve_max_seq_length(requested, base.max_position_embeddings, method)
    tokenizer = tokenizer_for(platform.store, base, layout.home_base_model_cache_dir(platform.settings.home))
    options = {k: v for k, v in data.items() if k != "pii_policy"}
    prepared = prepare_for_job(platform.store, PrepareRequest(
        tenant_id=tenant.tenant_id, training=(training.key, training.filename, training.sha256),
        validation=(validation.key, validation.filename, validation.sha256) if validation else None,
        base_sha256=base.sha256, method=method, max_seq_length=max_seq_length, seed=seed,
        options=options, pii_policy=data["pii_policy"], required_fields=graders.required_fields(request, requested),
    ), tokenizer, min_examples=platform.settings.min_training_examples,
        contamination=eval_sets.index_for(session, platform.store, tenant.tenant_id), keep=keep_dataset)
    shape = model_shape(platform.store, base)
    lora = hyperparams.resolve_lora(training_type, base.num_parameters)
    memory_gb = planning_memory_gb(platform, request)

    def micro_batch_for(batch_size: int, seq_len: int) -> tuple[int, int]:
        """The largest micro-batch the memory model says fits one GPU (at most MAX_MICRO_BATCH)."""
        if shape is None:
            micro = max(m for m in range(1, min(batch_size, hyperparams.MAX_MICRO_BATCH) + 1) if batch_size % m == 0)
            return micro, batch_size // micro
        tokens_per_example, rollout = step_shape(batch_size, seq_len)
        choice = memory.choose_micro_batch(
            shape, training_type=training_type.type, seq_len=tokens_per_example,
            memory_bytes=int(memory_gb * memory.GIB),
            batch_size=batch_size, max_micro_batch=hyperparams.MAX_MICRO_BATCH, lora_rank=lora.rank, **rollout)
        return choice.micro_batch_size, choice.gradient_accumulation_steps

    def step_shape(batch_size: int, seq_len: int) -> tuple[int, dict[str, int]]:
        """Tokens of one example as the memory model counts them, and the rollout of a generating method."""
        group = rollout_group(method, requested)
        tokens_per_example = seq_len * (group or methods.get(method).sequences_per_example)  # e.g. DPO: both answers
        rollout = {"rollout_sequences": min(ROLLOUT_ROWS, batch_size * group), "rollout_tokens": seq_len} \
            if group else {}
        return tokens_per_example, rollout

    resolved_hp = hyperparams.resolve(requested, training_type, num_examples=prepared.train_examples,
                                      model_max_positions=base.max_position_embeddings, method=method,
                                      micro_batch_for=micro_batch_for)
    resources = resolve_resources(platform.settings, request, base, training_type.type, shape,
                                  seq_len=max_seq_length, lora_rank=lora.rank, memory_gb=memory_gb)
    tokens_per_example, rollout = step_shape(resolved_hp.batch_size, max_seq_length)
    need_gb = per_gpu_need_gb(base, training_type.type, resources, shape, micro_batch_size=resolved_hp.micro_batch_size,
                              seq_len=tokens_per_example, lora_rank=lora.rank, **rollout)
    resources = replace(resources, min_gpu_memory_gb=max(resources.min_gpu_memory_gb, nominal_gb(need_gb)))
    estimate = estimates.estimate(
        platform.settings, base, train_tokens_per_epoch=prepared.train_tokens,
        train_examples=prepared.train_examples, n_epochs=resolved_hp.n_epochs,
        batch_size=resolved_hp.batch_size, training_type=training_type.type, gpus=resources.gpus,
        rollout_group=rollout_group(method, requested), completion_tokens=completion_tokens(method, requested),
    )
    return Plan(prepared, method, training_type.type, resolved_hp, lora, data, estimate, resources)


def on_shared_pool(settings: Settings, plan: Plan, *, continued: bool, asked_gpus: bool) -> bool:
    """Whether the planned job trains as a client of its base's shared co-training worker
    (`settings.pool_jobs_max_*`): a supervised LoRA job on one GPU that the tenant did not size,
    with what the shared worker trains (dropout 0, every linear layer of the blocks, no parent's
    adapter), within the operator's rank, step and token limits."""
    if settings.pool_jobs_max_rank <= 0 or continued or asked_gpus:
        return False
    hp, lora, resources = plan.hyperparameters, plan.lora, plan.resources
    if plan.method != "supervised" or plan.training_type != "lora" or resources.gpus != 1 or resources.strategy:
        return False
    if lora.rank > settings.pool_jobs_max_rank or lora.dropout or lora.target_modules != "all-linear":
        return False
    steps = hp.n_epochs * -(-plan.prepared.train_examples // max(1, hp.batch_size))
    return steps <= settings.pool_jobs_max_steps and \
        plan.prepared.train_tokens * hp.n_epochs <= settings.pool_jobs_max_tokens


# bytes of GPU memory per parameter: frozen bf16 weights for adapters; weights, gradients and
# Adam moments in mixed precision for a full fine-tune; 4-bit weights for QLoRA
_BYTES_PER_PARAM = {"lora": 2.0, "qlora": 0.6, "full": 16.0}
_MEMORY_HEADROOM = 0.7  # activations, adapter states, fragmentation


def model_shape(store: ObjectStore, base: BaseModelRow) -> memory.ModelShape | None:
    """The base model's sizes from its config.json, for the memory model (None when the
    config is missing or not a dense decoder the model covers)."""
    try:
        return memory.ModelShape.from_config(json.loads(store.get_bytes(layout.base_model_config_key(base.prefix))))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def inventory_hardware(platform: Platform) -> list[NodeHardware]:
    """The GPU model and memory of each node with GPUs, as this process knows the inventory
    (`Platform.capacity()`); empty when it is unknown."""
    capacity = platform.capacity()
    return [NodeHardware(n.name, n.gpu_model, n.gpu_memory_gb) for n in (capacity.nodes if capacity else [])
            if n.total_gpus > 0]


def check_hardware_exists(platform: Platform, request: JobRequest) -> None:
    """400 when the GPU type or least memory per GPU the request asks for exists on no node of a
    known inventory (what the plan itself needs per GPU is judged at validation, once planned);
    an unknown inventory, or nodes that do not report their hardware, are not judged."""
    asked = request.resources
    if asked is None or not (asked.gpu_type or asked.gpu_memory_gb):
        return
    nowhere = why_nowhere(GpuAsk.parse(asked.gpu_type, asked.gpu_memory_gb or 0.0), inventory_hardware(platform))
    if nowhere:
        raise invalid(f"{nowhere[0]}: the job {nowhere[1]}" if nowhere[0] == "resources.gpu_memory_gb"
                      else f"{nowhere[0]}: {nowhere[1]}", param=nowhere[0], code="resources_unavailable")


def planning_memory_gb(platform: Platform, request: JobRequest) -> float:
    """Memory of one GPU to plan the job for: as it asked (resources.gpu_memory_gb); else the
    smallest reported memory among the nodes that match its GPU type (so a fleet of 24 GB GPUs
    plans for 24 GB); else the memory its type names ("a100-80gb"); else TUNEFORGE_GPU_MEMORY_GB."""
    asked = request.resources
    if asked and asked.gpu_memory_gb:
        return float(asked.gpu_memory_gb)
    ask = GpuAsk.parse(asked.gpu_type if asked else None)
    return inventory_memory_gb(ask, inventory_hardware(platform)) or ask.memory_gb or platform.settings.gpu_memory_gb


def per_gpu_need_gb(base: BaseModelRow, training_type: str, resources: ResolvedResources,
                    shape: memory.ModelShape | None, *, micro_batch_size: int, seq_len: int, lora_rank: int,
                    **rollout: int) -> float:
    """GiB one GPU needs for the job as planned: the memory model's estimate at the planned
    micro-batch (and a generating method's rollout), sharded over the job's GPUs under FSDP, with
    the headroom the planner keeps; without a model shape, the bytes-per-parameter rule the GPU
    count came from."""
    shards = resources.gpus if resources.strategy == "fsdp" else 1
    if shape is not None:
        need = memory.estimate(shape, training_type=training_type, micro_batch_size=max(1, micro_batch_size),
                               seq_len=seq_len, lora_rank=lora_rank, shards=max(1, shards),
                               gradient_checkpointing=resources.gradient_checkpointing, **rollout)
        return need.total_bytes / 0.9 / memory.GIB
    params = base.num_parameters or base.size_bytes // 2
    return params * _BYTES_PER_PARAM.get(training_type, 2.0) / 1e9 / max(1, shards) / _MEMORY_HEADROOM


def resolve_resources(settings: Settings, request: JobRequest, base: BaseModelRow, training_type: str,
                      shape: memory.ModelShape | None = None, seq_len: int = 2048,
                      lora_rank: int = 16, memory_gb: float | None = None) -> ResolvedResources:
    """GPUs as asked, or as many as the memory model says the job needs at micro-batch 1
    (`memory.gpus_needed`, weights and optimizer states sharded); without a model shape, as
    many as the weights (and, for a full fine-tune, optimizer states) need, rounded up to a
    power of two. A job larger than a node takes whole nodes (`gpus_per_node`)."""
    asked = request.resources
    memory_gb = memory_gb or (asked and asked.gpu_memory_gb) or settings.gpu_memory_gb
    checkpointing = training_type == "qlora"
    if asked and asked.gpus:
        gpus = asked.gpus
    elif shape is not None:
        gpus, checkpointing = _gpus_from_memory_model(shape, training_type, seq_len, memory_gb, lora_rank)
    else:
        params = base.num_parameters or base.size_bytes // 2
        need_gb = params * _BYTES_PER_PARAM.get(training_type, 2.0) / 1e9
        gpus = 1
        while gpus * memory_gb * _MEMORY_HEADROOM < need_gb:
            gpus *= 2
    per_node = _gpus_per_node(settings, gpus, asked.nodes if asked else None)
    if shape is not None:
        unsharded = memory.estimate(shape, training_type=training_type, micro_batch_size=1, seq_len=seq_len,
                                    lora_rank=lora_rank, gradient_checkpointing=checkpointing)
        fits_one_gpu = unsharded.total_bytes <= 0.9 * memory_gb * memory.GIB
    else:
        params = base.num_parameters or base.size_bytes // 2
        fits_one_gpu = params * _BYTES_PER_PARAM.get(training_type, 2.0) / 1e9 <= memory_gb * _MEMORY_HEADROOM
    asked_strategy = request.distributed.strategy if request.distributed else None
    strategy = choose_strategy(asked_strategy, training_type, gpus, fits_one_gpu=fits_one_gpu)
    return ResolvedResources(gpus=gpus, gpus_per_node=per_node,
                             gpu_type=(asked and asked.gpu_type) or settings.gpu_type,
                             gpu_memory_gb=memory_gb, gradient_checkpointing=checkpointing, strategy=strategy,
                             required_gpu_type=(asked and asked.gpu_type) or "",
                             min_gpu_memory_gb=GpuAsk.parse(asked and asked.gpu_type,
                                                            (asked and asked.gpu_memory_gb) or 0.0).memory_gb,
                             capacity=(asked and asked.capacity) or "",
                             deadline=float(asked.deadline) if asked and asked.deadline is not None else None,
                             max_price=asked.max_price if asked else None)


def check_strategy(asked: str | None, training_type: str) -> None:
    """What is refused whatever the model: sharding a QLoRA job."""
    if training_type == "qlora" and asked == "fsdp":
        raise invalid("distributed.strategy \"fsdp\" cannot shard a QLoRA job: its 4-bit base weights "
                      "(bitsandbytes) are not shardable here; use \"ddp\", or training_type \"lora\" "
                      "to shard the base", param="distributed.strategy")


def choose_strategy(asked: str | None, training_type: str, gpus: int, *, fits_one_gpu: bool) -> str:
    """How `gpus` GPUs share the job ("" for one): as asked, else FSDP (sharded) for a full
    fine-tune or a job whose model, gradients and optimizer states do not fit one GPU, DDP
    (replicated) for the rest. QLoRA is never sharded."""
    check_strategy(asked, training_type)
    if training_type == "qlora":
        if gpus > 1 and not fits_one_gpu:
            raise invalid("the QLoRA job does not fit one GPU and QLoRA cannot be sharded over several: use "
                          "training_type \"lora\" (sharded with FSDP), GPUs with more memory or a shorter "
                          "max_seq_length", param="resources.gpus", code="resources_unavailable")
    if gpus <= 1:
        return ""
    if asked == "ddp" and not fits_one_gpu:
        raise invalid("distributed.strategy \"ddp\" keeps the whole model on every GPU, and this job does not "
                      "fit one; use \"fsdp\"", param="distributed.strategy", code="resources_unavailable")
    if asked:
        return asked
    return "fsdp" if training_type == "full" or not fits_one_gpu else "ddp"


def _gpus_per_node(settings: Settings, gpus: int, nodes: int | None) -> int:
    """GPUs on each node of a multi-node job; 0: all on one node."""
    if nodes is not None:
        if nodes == 1:
            return 0
        if gpus % nodes:
            raise invalid(f"resources.gpus ({gpus}) must split evenly over resources.nodes ({nodes})",
                          param="resources.nodes")
        return gpus // nodes
    per_node = settings.gpus_per_node if gpus > settings.gpus_per_node else 0
    if per_node and gpus % per_node:
        raise invalid(f"resources.gpus ({gpus}) above one node must be a multiple of the node size "
                      f"({per_node})", param="resources.gpus")
    return per_node


def _gpus_from_memory_model(shape: memory.ModelShape, training_type: str, seq_len: int, memory_gb: float,
                            lora_rank: int) -> tuple[int, bool]:
    """GPUs at micro-batch 1, and whether the trainer must recompute activations (gradient
    checkpointing) for the job to fit at all — the cheaper answer first."""
    budget = int(memory_gb * memory.GIB)
    try:
        return memory.gpus_needed(shape, training_type=training_type, seq_len=seq_len, gpu_memory_bytes=budget,
                                  lora_rank=lora_rank), training_type == "qlora"
    except memory.DoesNotFit:
        pass
    try:
        return memory.gpus_needed(shape, training_type=training_type, seq_len=seq_len, gpu_memory_bytes=budget,
                                  lora_rank=lora_rank, gradient_checkpointing=True), True
    except memory.DoesNotFit as exc:
        raise invalid(f"the job does not fit: {exc}", param="resources.gpus",
                      code="resources_unavailable") from None
