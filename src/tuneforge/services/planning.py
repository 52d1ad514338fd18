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


@dataclass
class Plan:
    prepared: PreparedDataset
    hyperparameters: Hyperparameters
    lora: LoraConfig
    data: dict[str, Any]
    estimate: dict[str, Any]

    def resolved(self, checkpoint: dict[str, int]) -> dict[str, Any]:
        """What the job row keeps (`jobs.resolved`)."""
        return {
            "hyperparameters": asdict(self.hyperparameters),
            "lora": asdict(self.lora),
            "checkpoint": checkpoint,
            "gpus": self.estimate["gpus"],
            "num_examples": self.prepared.train_examples,
            "data": {**self.prepared.to_dict(), **self.data},
            "estimate": self.estimate,
        }


def plan_job(session: Session, platform: Platform, tenant: Tenant, request: JobCreate, *, seed: int,
             training: FileRow, validation: FileRow | None, base: BaseModelRow) -> Plan:
    """Raises DataCheckFailed (bad data) or ApiError (bad hyperparameters)."""
    training_type = request.training_type or TrainingType()
    requested = hyperparams.requested_hyperparameters(request)
    data = (request.data or DataOptions()).model_dump()
    data["pii_policy"] = data.get("pii_policy") or tenant.pii_policy or "warn"
    max_seq_length = hyperparams.resolve_max_seq_length(requested, base.max_position_embeddings)
    tokenizer = tokenizer_for(platform.store, base, platform.settings.home / "cache" / "base-models")
    options = {k: v for k, v in data.items() if k != "pii_policy"}
    prepared = prepare_for_job(platform.store, PrepareRequest(
        tenant_id=tenant.tenant_id, training=(training.key, training.filename, training.sha256),
        validation=(validation.key, validation.filename, validation.sha256) if validation else None,
        base_sha256=base.sha256, method="supervised", max_seq_length=max_seq_length, seed=seed,
        options=options, pii_policy=data["pii_policy"],
    ), tokenizer, min_examples=platform.settings.min_training_examples,
        contamination=eval_sets.index_for(session, platform.store, tenant.tenant_id))
    resolved_hp = hyperparams.resolve(requested, training_type, num_examples=prepared.train_examples,
                                      model_max_positions=base.max_position_embeddings)
    estimate = estimates.estimate(
        platform.settings, base, train_tokens_per_epoch=prepared.train_tokens,
        train_examples=prepared.train_examples, n_epochs=resolved_hp.n_epochs,
        batch_size=resolved_hp.batch_size, training_type=training_type.type,
    )
    return Plan(prepared, resolved_hp, hyperparams.resolve_lora(training_type), data, estimate)
