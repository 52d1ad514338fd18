"""A migrated platform for tests, tenants with keys, and a registered base model."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers import schema
from tuneforge.db.migrate import upgrade
from tuneforge.services.context import Platform
from tuneforge.services.serving import base_models as base_model_service
from tuneforge.services.tenancy import tenants as tenant_service
from tuneforge.settings import Settings


def make_platform(tmp_path: Path, database_url: str, **overrides) -> Platform:
    settings = Settings(home=tmp_path / "home", database_url=database_url, **overrides)
    schema.at_head(settings.resolved_database_url)  # a fresh database: a copy of the schema, not its creation
    upgrade(settings.resolved_database_url)
    return Platform.from_settings(settings)


def add_tenant(platform: Platform, name: str, tier: str = "standard") -> str:
    with platform.db.session() as session:
        _tenant, api_key = tenant_service.create_tenant(session, name, tier)
    return api_key


def fake_model_dir(path: Path, max_positions: int = 512) -> Path:
    """Files shaped like a model folder: enough to register, not to load."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "max_position_embeddings": max_positions}))
    (path / "model.safetensors").write_bytes(b"\0" * 64)
    (path / "tokenizer.json").write_text("{}")
    return path


def add_base_model(platform: Platform, name: str, source: Path) -> str:
    with platform.db.session() as session:
        row = base_model_service.add_base_model(session, platform.store, name, str(source),
                                                platform.settings.home / "cache")
        return row.sha256


def chat_lines(count: int, prefix: str = "q") -> bytes:
    lines = []
    for i in range(count):
        lines.append(json.dumps({"messages": [
            {"role": "system", "content": "You answer with a code."},
            {"role": "user", "content": f"{prefix} {i}?"},
            {"role": "assistant", "content": f"code-{i}"},
        ]}))
    return ("\n".join(lines) + "\n").encode()


def tenant_with_model(tmp_path: Path, database_url: str, model_dir: Path, **overrides) -> str:
    """For a control plane a test starts itself: migrate, create tenant "acme" and register
    `model_dir` as "tiny-chat" in the store `overrides` name; returns the tenant's key."""
    platform = make_platform(tmp_path, database_url, **overrides)
    try:
        key = add_tenant(platform, "acme")
        add_base_model(platform, "tiny-chat", model_dir)
    finally:
        platform.db.dispose()
    return key


def add_running_job(platform: Platform, tenant_name: str) -> tuple[str, str, str]:
    """A new tenant with one job in status `running`, written straight to the database (no files,
    no validation, no scheduler): (the tenant's API key, its tenant id, the job id)."""
    import time

    from tuneforge.db.tables import Job
    from tuneforge.domain.ids import new_id
    from tuneforge.domain.job_config import JobRequest

    with platform.db.session() as session:
        tenant, api_key = tenant_service.create_tenant(session, tenant_name)
        job_id = new_id("ftjob")
        session.add(Job(job_id=job_id, tenant_id=tenant.tenant_id, model="tiny-base", base_model_sha256="0" * 64,
                        training_file="file-train", status="running", seed=0,
                        request=JobRequest(model="tiny-base", training_file="file-train"),
                        request_hash="0" * 64, created_at=int(time.time())))
        return api_key, tenant.tenant_id, job_id


def add_finished_job(platform: Platform, tenant_name: str) -> tuple[str, str]:
    """A new tenant with a succeeded job and its fine-tuned model in the registry, written straight
    to the database (no artifacts): (the tenant's API key, the model id)."""
    import time

    from tuneforge.db.tables import FineTunedModel, Job

    api_key, tenant_id, job_id = add_running_job(platform, tenant_name)
    model_id = f"ft:tiny-base:{tenant_name}::{job_id[-6:]}"
    with platform.db.session() as session:
        job = session.query(Job).filter_by(job_id=job_id).one()
        job.status, job.fine_tuned_model = "succeeded", model_id
        session.add(FineTunedModel(model_id=model_id, tenant_id=tenant_id, job_id=job_id, base_model="tiny-base",
                                   base_model_sha256="0" * 64, artifact_prefix=f"tenants/{tenant_id}/jobs/{job_id}",
                                   created_at=int(time.time())))
    return api_key, model_id
