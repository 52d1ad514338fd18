"""The training API's REST side: a tenant's training runs and their checkpoints, as the SDK's
`RestClient` lists them, read from the object store under the tenant's own prefix (blocking:
call from a thread)."""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from typing import Any

from tuneforge.domain.errors import invalid, not_found
from tuneforge.storage import layout

RECORD_NAME = "checkpoint.json"
RUN_NAME = "run.json"
CHECKPOINT_KINDS = ("weights", "sampler_weights")
TINKER_PATH = re.compile(r"^tinker://([^/]+)/(weights|sampler_weights)/([^/]+)$")


def _read(store: Any, key: str) -> dict[str, Any] | None:
    try:
        return json.loads(store.get_bytes(key))
    except (FileNotFoundError, KeyError, ValueError):
        return None


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=timezone.utc).isoformat().replace("+00:00", "Z")


def _run_folder(tenant: str, run_id: str) -> str:
    try:
        return layout.training_run_key(tenant, run_id).rsplit("/", 1)[0]
    except ValueError:  # a run id no key can hold (".."): no run has it
        raise not_found(f"training run {run_id} not found", "run_id") from None


def run_record(store: Any, tenant: str, run_id: str) -> dict[str, Any]:
    record = _read(store, f"{_run_folder(tenant, run_id)}/{RUN_NAME}")
    if record is None or record.get("training_run_id") != run_id:
        raise not_found(f"training run {run_id} not found", "run_id")
    return record


def checkpoint_at(store: Any, tenant: str, tinker_path: Any, param: str = "path") -> tuple[dict[str, Any], str]:
    """The tenant's checkpoint at `tinker_path`: its record and its prefix (404 when it has none;
    another tenant's path is looked up under this tenant's prefix, so it is none)."""
    match = TINKER_PATH.match(str(tinker_path or ""))
    if match is None:
        raise invalid(f"{param} must be tinker://<model id>/weights/<name> or .../sampler_weights/<name>", param)
    run_id, kind, name = match.groups()
    try:
        prefix = layout.training_checkpoint_prefix(tenant, run_id, kind, name)
    except ValueError:  # a part no key can hold ("..")
        raise invalid(f"{param} names no checkpoint: {tinker_path}", param) from None
    record = _read(store, f"{prefix}/{RECORD_NAME}")
    if record is None or record.get("run_id") != run_id:
        raise not_found(f"checkpoint {tinker_path} not found", param)
    return record, prefix


def checkpoints(store: Any, tenant: str, run_id: str | None = None) -> list[dict[str, Any]]:
    """The tenant's checkpoints (of one run, or all), newest first, without internal fields."""
    prefix = layout.training_runs_prefix(tenant)
    if run_id is not None:
        prefix = _run_folder(tenant, run_id)
    found = []
    for key in store.list(prefix):
        if key.endswith("/" + RECORD_NAME):
            record = _read(store, key)
            if record is not None and (run_id is None or record.get("run_id") == run_id):
                found.append(record)
    found.sort(key=lambda record: record.get("time", ""), reverse=True)
    return found


def public_checkpoint(record: dict[str, Any]) -> dict[str, Any]:
    keys = ("checkpoint_id", "checkpoint_type", "time", "tinker_path", "size_bytes", "public", "user_metadata",
            "expires_at")
    return {key: record.get(key) for key in keys}


def training_run(store: Any, tenant: str, run_id: str, last_request: float | None = None) -> dict[str, Any]:
    record = run_record(store, tenant, run_id)
    own = checkpoints(store, tenant, run_id)
    training = next((c for c in own if c.get("checkpoint_type") == "training"), None)
    sampler = next((c for c in own if c.get("checkpoint_type") == "sampler"), None)
    return {"training_run_id": run_id, "base_model": record["base_model"], "model_owner": tenant, "is_lora": True,
            "corrupted": False, "lora_rank": record.get("lora_rank"),
            "last_request_time": _iso(last_request or record.get("last_request_time") or record["created"]),
            "last_checkpoint": public_checkpoint(training) if training else None,
            "last_sampler_checkpoint": public_checkpoint(sampler) if sampler else None,
            "user_metadata": record.get("user_metadata")}


def training_runs(store: Any, tenant: str, limit: int, offset: int) -> dict[str, Any]:
    ids = []
    for key in store.list(layout.training_runs_prefix(tenant)):
        if key.endswith("/" + RUN_NAME):
            record = _read(store, key)
            if record is not None and "training_run_id" in record:
                ids.append((record.get("created", 0), record["training_run_id"]))
    ids.sort(reverse=True)
    limit, offset = max(0, min(limit, 1000)), max(0, offset)
    page = [training_run(store, tenant, run_id) for _created, run_id in ids[offset:offset + limit]]
    return {"training_runs": page, "cursor": {"offset": offset, "limit": limit, "total_count": len(ids)}}


def delete_checkpoint(store: Any, tenant: str, run_id: str, checkpoint_id: str) -> None:
    kind, _, name = checkpoint_id.partition("/")
    if kind not in CHECKPOINT_KINDS or not name.strip(".") or "/" in name:
        raise invalid("checkpoint_id must be weights/<name> or sampler_weights/<name>", "checkpoint_id")
    _run_folder(tenant, run_id)  # 404 for a run id no key can hold
    prefix = layout.training_checkpoint_prefix(tenant, run_id, kind, name)
    record = _read(store, f"{prefix}/{RECORD_NAME}")
    if record is None or record.get("run_id") != run_id:
        raise not_found(f"checkpoint {checkpoint_id} of {run_id} not found", "checkpoint_id")
    store.delete(f"{prefix}/{RECORD_NAME}")  # first: without it the checkpoint no longer exists
    store.delete_prefix(prefix)
