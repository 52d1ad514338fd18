"""Models (/v1/models): OpenAI's model object, list and delete; the registry's extensions follow
the OpenAI fields (type, and for a fine-tuned model base_model, job_id, artifact, stage, evaluated,
promotable, gate results against the base model, eval results, `champion`: the same gates against
the lineage's production model, lineage, config_hash, deprecated, delete_after)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tuneforge.api.schemas.base import ApiObject, Deleted, Number


class Model(ApiObject):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str = Field(description="tuneforge for a base model; the tenant for a fine-tuned one.")
    type: Literal["base", "fine-tuned"] = Field(description="Extension.")


class ModelList(ApiObject):
    """Base models first, then the tenant's fine-tuned models."""

    object: Literal["list"]
    data: list[Model]


class ModelDeleted(Deleted):
    """Deleting deprecates: the artifacts are removed at `delete_after` (extension)."""

    object: Literal["model"]
    delete_after: Number | None = None


class StageChange(ApiObject):
    object: Literal["model.stage_change"]
    model: str
    from_stage: str | None
    to_stage: str
    actor: str
    override: bool | None
    reason: str | None
    created_at: int


class StageHistory(ApiObject):
    object: Literal["list"]
    data: list[StageChange]
