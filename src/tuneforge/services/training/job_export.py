"""A job as a create body that re-runs it exactly: the request as given, with every value the
platform chose made explicit (seed, hyperparameters, adapter settings, checkpointing), and a
`lock` naming the base model's and the data's SHA-256 (checked when the body is posted again).

Re-posting it trains the same thing: the new job's configuration hash equals the old one's.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from sqlalchemy.orm import Session

from tuneforge import __version__, methods
from tuneforge.db.repos import files as file_repo
from tuneforge.db.tables import Job
from tuneforge.domain.errors import ApiError
from tuneforge.domain.job_config import Checkpointing, JobRequest


def export(session: Session, job: Job) -> dict[str, Any]:
    resolved = job.resolved
    if resolved is None:
        raise ApiError(409, f"{job.job_id} has not been validated yet; its configuration is not settled",
                       param="job_id", code="job_not_validated")
    body = {key: value for key, value in job.request.to_json().items() if key not in ("hyperparameters", "lock")}
    method = job.request.method_type
    given = dict((body.get("method") or {}).get(method) or {})
    takes = methods.get(method).hyperparameters.model_fields  # what a body may give (not micro_batch_size…)
    chosen = {key: value for key, value in resolved.hyperparameters.flat().items() if key in takes}
    body["method"] = {"type": method, method: {**given, "hyperparameters": chosen}}
    body["seed"] = job.seed
    if job.request.training_type_kind == "full":
        body["training_type"] = {**(body.get("training_type") or {}), "type": "full"}
    else:
        lora = resolved.lora
        body["training_type"] = {"type": job.request.training_type_kind, "rank": lora.rank, "alpha": lora.alpha,
                                 "dropout": lora.dropout, "target_modules": lora.target_modules
                                 if isinstance(lora.target_modules, str) else list(lora.target_modules)}
    checkpoint = asdict(resolved.checkpoint)
    body["checkpointing"] = {key: value for key, value in checkpoint.items()
                             if key in Checkpointing.model_fields and value is not None
                             and not (key == "every_minutes" and not value)}  # 0: off, as leaving it out
    training = file_repo.get(session, job.tenant_id, job.training_file)
    validation = file_repo.get(session, job.tenant_id, job.validation_file) if job.validation_file else None
    if training is None or (job.validation_file and validation is None):
        raise ApiError(409, f"{job.job_id}'s data files have been deleted; it cannot be exported",
                       param="job_id", code="job_files_deleted")
    body["lock"] = {
        "base_model": {"name": job.model, "sha256": job.base_model_sha256},
        "training_file": {"id": training.file_id, "sha256": training.sha256},
        **({"validation_file": {"id": validation.file_id, "sha256": validation.sha256}} if validation else {}),
        "config_hash": job.config_hash, "exported_from": job.job_id, "tuneforge_version": __version__,
    }
    JobRequest.model_validate(body)  # what is exported is a body the API takes
    return body
