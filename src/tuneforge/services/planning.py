"""Plan a job: check its data against the base model, prepare the dataset,
resolve every "auto" value and estimate its cost. Used by job validation and
by `POST /v1/fine_tuning/jobs/estimate`, so both give the same figures."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy.orm import Session

from tuneforge.db.tables import BaseModelRow, FileRow, Tenant
from tuneforge.domain.job_config import DataOptions, JobCreate, TrainingType
from tuneforge.domain.spec import Hyperparameters, LoraConfig
from tuneforge.services import estimates, eval_sets, hyperparams
from tuneforge.services.context import Platform
from tuneforge.services.datasets import PreparedDataset, PrepareRequest, prepare_for_job
from tuneforge.services.tokenizers import tokenizer_for
from tuneforge.settings import Settings
from tuneforge.domain.errors import invalid


@dataclass
class Plan:
    prepared: PreparedDataset
    hyperparameters: Hyperparameters
    lora: LoraConfig
    data: dict[str, Any]
    estimate: dict[str, Any]
    resources: dict[str, Any]

    def resolved(self, checkpoint: dict[str, int]) -> dict[str, Any]:
        """What the job row keeps (`jobs.resolved`)."""
        return {
            "hyperparameters": asdict(self.hyperparameters),
            "lora": asdict(self.lora),
            "checkpoint": checkpoint,
            "gpus": self.resources["gpus"],
            "resources": self.resources,
            "num_examples": self.prepared.train_examples,
            "data": {**self.prepared.to_dict(), **self.data},
            "estimate": self.estimate,
        }


def plan_job(session: Session, platform: Platform, tenant: Tenant, request: JobCreate, *, seed: int,
             training: FileRow, validation: FileRow | None, base: BaseModelRow) -> Plan:
    """Raises DataCheckFailed (bad data) or ApiError (bad hyperparameters)."""
    training_type = request.training_type or TrainingType()
    requested = hyperparams.requested_hyperparameters(request)
    method = hyperparams.method_of(request)
    data = (request.data or DataOptions()).model_dump()
    data["pii_policy"] = data.get("pii_policy") or tenant.pii_policy or "warn"
    max_seq_length = hyperparams.resolve_max_seq_length(requested, base.max_position_embeddings, method)
    tokenizer = tokenizer_for(platform.store, base, platform.settings.home / "cache" / "base-models")
    options = {k: v for k, v in data.items() if k != "pii_policy"}
    prepared = prepare_for_job(platform.store, PrepareRequest(
        tenant_id=tenant.tenant_id, training=(training.key, training.filename, training.sha256),
        validation=(validation.key, validation.filename, validation.sha256) if validation else None,
        base_sha256=base.sha256, method=method, max_seq_length=max_seq_length, seed=seed,
        options=options, pii_policy=data["pii_policy"],
    ), tokenizer, min_examples=platform.settings.min_training_examples,
        contamination=eval_sets.index_for(session, platform.store, tenant.tenant_id))
    resolved_hp = hyperparams.resolve(requested, training_type, num_examples=prepared.train_examples,
                                      model_max_positions=base.max_position_embeddings, method=method)
    resources = resolve_resources(platform.settings, request, base, training_type.type)
    estimate = estimates.estimate(
        platform.settings, base, train_tokens_per_epoch=prepared.train_tokens,
        train_examples=prepared.train_examples, n_epochs=resolved_hp.n_epochs,
        batch_size=resolved_hp.batch_size, training_type=training_type.type, gpus=resources["gpus"],
    )
    return Plan(prepared, resolved_hp, hyperparams.resolve_lora(training_type, base.num_parameters), data, estimate, resources)


# bytes of GPU memory per parameter: frozen bf16 weights for adapters; weights, gradients and
# Adam moments in mixed precision for a full fine-tune; 4-bit weights for QLoRA
_BYTES_PER_PARAM = {"lora": 2.0, "qlora": 0.6, "full": 16.0}
_MEMORY_HEADROOM = 0.7  # activations, adapter states, fragmentation


def resolve_resources(settings: Settings, request: JobCreate, base: BaseModelRow, training_type: str) -> dict:
    """GPUs as asked, or as many as the model's weights (and, for a full fine-tune, its optimizer
    states) need at the assumed GPU memory, rounded up to a power of two; a job larger than a
    node takes whole nodes (`gpus_per_node`)."""
    asked = request.resources
    memory_gb = (asked and asked.gpu_memory_gb) or settings.gpu_memory_gb
    if asked and asked.gpus:
        gpus = asked.gpus
    else:
        params = base.num_parameters or base.size_bytes // 2
        need_gb = params * _BYTES_PER_PARAM.get(training_type, 2.0) / 1e9
        gpus = 1
        while gpus * memory_gb * _MEMORY_HEADROOM < need_gb:
            gpus *= 2
    per_node = settings.gpus_per_node if gpus > settings.gpus_per_node else 0
    if per_node and gpus % per_node:
        raise invalid(f"resources.gpus ({gpus}) above one node must be a multiple of the node size "
                      f"({per_node})", param="resources.gpus")
    return {"gpus": gpus, "gpus_per_node": per_node, "gpu_type": (asked and asked.gpu_type) or settings.gpu_type,
            "gpu_memory_gb": memory_gb}
