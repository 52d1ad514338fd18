"""Fine-tuned models and checkpoints by name: what a job may continue from, and what chat may run.

Names, as OpenAI's:

- a fine-tuned model: `ft:{base}:{tenant}:{suffix}:{tag}`, `tag` the last 8 characters of its
  job's id (`model_id`), fixed when the job is created, so a checkpoint is named before the
  job ends;
- a checkpoint: `{model}:ckpt-step-{N}`.

A job whose `model` is one of these continues from those weights, and its lineage names the
parent:

- an adapter (a LoRA/QLoRA model or checkpoint): the adapter's files are copied under the new job
  when it is created (`copy_adapter`), so the parent's later deletion or checkpoint pruning cannot
  take them away; the new adapter has the parent's LoRA settings and trains on the parent's base
  model (the same SHA);
- a full fine-tune (its final model): a full fine-tune again, whose starting weights are the
  parent's, read in place (a copy of a whole model per job would cost its size each time); a
  deleted parent's files stay while an unfinished job continues from it
  (`registry.models.purge_expired`). An adapter on a full model's weights is not supported yet.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy.orm import Session

from tuneforge.db.repos import checkpoints as checkpoint_repo
from tuneforge.db.repos import jobs as job_repo
from tuneforge.db.repos import models as model_repo
from tuneforge.db.tables import Checkpoint, FineTunedModel, Job
from tuneforge.domain.status import JobStatus
from tuneforge.storage import layout
from tuneforge.storage.store import ObjectStore

_CHECKPOINT = re.compile(r"^(?P<model>ft:.+):ckpt-step-(?P<step>\d{1,10})$")
TAG_CHARS = 8
# a checkpoint folder holds the optimizer and trainer state too: only these make the adapter
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def shown(parent: dict | None) -> dict | None:
    """What a job's `parent` shows (on the job, in lineage): the name, job and step, never where the
    weights are stored."""
    if not parent:
        return None
    return {key: parent.get(key) for key in ("model", "job_id", "step")}


def model_id(job: Job, tenant_name: str) -> str:
    """The fine-tuned model a job makes, named before it runs."""
    return f"ft:{job.model}:{tenant_name}:{job.suffix or ''}:{job.job_id[-TAG_CHARS:]}"


def checkpoint_name(job: Job, tenant_name: str, step: int) -> str:
    return f"{job.fine_tuned_model or model_id(job, tenant_name)}:ckpt-step-{step}"


@dataclass(frozen=True)
class Parent:
    """Weights a name points at: a registered model, or one checkpoint of a job."""

    name: str
    job: Job | None  # None: a model no job made (a training-API checkpoint registered as a model)
    step: int | None  # None: the job's final model
    model: FineTunedModel | None  # the registry row, for a final model
    checkpoint: Checkpoint | None

    @property
    def kind(self) -> str:
        if self.model is not None:
            return self.model.artifact_kind
        assert self.job is not None
        return "model" if self.job.request.training_type_kind == "full" else "adapter"

    @property
    def weights_prefix(self) -> str:
        return self.model.artifact_prefix if self.model is not None else self.checkpoint.prefix  # type: ignore[union-attr]

    @property
    def base_model(self) -> str:
        return self.model.base_model if self.model is not None else self.job.model  # type: ignore[union-attr]

    @property
    def base_sha256(self) -> str:
        return self.model.base_model_sha256 if self.model is not None else self.job.base_model_sha256  # type: ignore[union-attr]

    @property
    def finished(self) -> bool:
        """Whether these weights are final: a checkpoint is, a job's model once the job succeeded."""
        return self.job is None or self.step is not None or self.job.status == JobStatus.SUCCEEDED.value

    def lora(self) -> dict[str, Any] | None:
        """The adapter's LoRA settings (rank, alpha, dropout, target_modules); None when unknown."""
        if self.job is None:
            return (self.model.lineage or {}).get("lora") if self.model is not None else None
        return asdict(self.job.resolved.lora) if self.job.resolved is not None else None

    def lineage(self) -> dict:
        return {"model": self.name, "job_id": self.job.job_id if self.job is not None else None, "step": self.step}


def find(session: Session, tenant_id: str, tenant_name: str, name: str) -> Parent | None:
    """The tenant's fine-tuned model or checkpoint called `name`; None when there is none (another
    tenant's is none too). A deleted model is none; its checkpoints are too."""
    if not name.startswith("ft:"):
        return None
    match = _CHECKPOINT.match(name)
    row = model_repo.get(session, tenant_id, name)  # a final model, or a checkpoint registered as one
    if row is not None or match is None:
        if row is None or row.deprecated_at is not None or row.artifacts_deleted_at is not None:
            return None
        step = int(match.group("step")) if match is not None else None
        if row.job_id is None:  # registered from a training-API checkpoint
            return Parent(name, None, step, row, None)
        job = job_repo.get(session, tenant_id, row.job_id)
        return None if job is None else Parent(name, job, step, row, None)
    job = _job_named(session, tenant_id, tenant_name, match.group("model"))
    if job is None:
        return None
    step = int(match.group("step"))
    if not checkpoints_offered(job):
        return None
    checkpoint = checkpoint_repo.at_step(session, tenant_id, job.job_id, step)
    return None if checkpoint is None else Parent(name, job, step, None, checkpoint)


def checkpoints_offered(job: Job) -> bool:
    """Whether a job's checkpoints are models the tenant may use (download, continue from, promote,
    chat with). As OpenAI's, a checkpoint is a model of a job that is under way or succeeded: a
    failed job made no model, so its partial weights are not offered as if it had (a cancelled
    job keeps them only when its policy asked to, `checkpointing.keep_on_cancel`)."""
    return job.status != JobStatus.FAILED.value


def _job_named(session: Session, tenant_id: str, tenant_name: str, name: str) -> Job | None:
    registered = model_repo.get(session, tenant_id, name)
    if registered is not None:
        if registered.deprecated_at is not None or registered.artifacts_deleted_at is not None \
                or registered.job_id is None:
            return None
        return job_repo.get(session, tenant_id, registered.job_id)
    tag = name.rsplit(":", 1)[-1]
    if len(tag) != TAG_CHARS:
        return None
    candidates = job_repo.ending_with(session, tenant_id, tag)
    return next((job for job in candidates if model_id(job, tenant_name) == name), None)


def copy_adapter(store: ObjectStore, parent: Parent, tenant_id: str, job_id: str) -> str:
    """The parent's adapter files copied under the new job; their prefix."""
    return copy_adapter_files(store, parent.weights_prefix, layout.parent_adapter_prefix(tenant_id, job_id))


def copy_adapter_files(store: ObjectStore, source: str, target: str) -> str:
    """The adapter's files under `source` (a model's artifact or a checkpoint) copied to `target`."""
    for name in ADAPTER_FILES:
        with store.open_read(f"{source.rstrip('/')}/{name}") as handle:
            store.put_stream(f"{target}/{name}", handle)
    return target
