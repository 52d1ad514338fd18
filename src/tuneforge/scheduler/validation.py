"""validating_files -> queued: resolve the job's configuration against its data
and base model. (Token-level checks against the tokenizer come with dataset
ingestion; the upload already checked syntax, shapes and roles.)"""

from __future__ import annotations

from dataclasses import asdict

from sqlalchemy.orm import Session

from tuneforge.db.repos import base_models as base_model_repo
from tuneforge.db.repos import files as file_repo
from tuneforge.db.tables import Job
from tuneforge.domain.errors import ApiError
from tuneforge.domain.job_config import JobCreate, TrainingType
from tuneforge.domain.status import JobStatus
from tuneforge.services import hyperparams
from tuneforge.services.transitions import transition
from tuneforge.settings import Settings


def validate_job(session: Session, settings: Settings, job: Job) -> None:
    request = JobCreate.model_validate(job.request)
    training = file_repo.get(session, job.tenant_id, job.training_file)
    base = base_model_repo.by_name(session, job.model)
    if training is None or base is None:
        _fail(session, job, "invalid_training_file", "the training file or base model was deleted")
        return
    training_type = request.training_type or TrainingType()
    try:
        resolved_hp = hyperparams.resolve(
            hyperparams.requested_hyperparameters(request), training_type,
            num_examples=training.num_examples or 0, model_max_positions=base.max_position_embeddings,
        )
        lora = hyperparams.resolve_lora(training_type)
    except ApiError as exc:
        _fail(session, job, "invalid_hyperparameters", exc.message)
        return
    policy = request.checkpointing
    job.resolved = {
        "hyperparameters": asdict(resolved_hp),
        "lora": asdict(lora),
        "checkpoint": {
            "every_steps": (policy and policy.every_steps) or settings.default_checkpoint_every_steps,
            "keep_last": (policy and policy.keep_last) or settings.default_checkpoint_keep_last,
        },
        "gpus": 1,
        "num_examples": training.num_examples,
    }
    transition(session, job, JobStatus.QUEUED, "Validated training file; job queued",
               data={"hyperparameters": asdict(resolved_hp)})


def _fail(session: Session, job: Job, code: str, message: str) -> None:
    transition(session, job, JobStatus.FAILED, f"Validation failed: {message}", level="error",
               error={"code": code, "message": message, "param": "training_file"})
