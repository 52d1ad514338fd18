"""`jobs.request` and `jobs.resolved` hold typed values; the database holds their JSON."""

from __future__ import annotations

import dataclasses
import json

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import StatementError

from tests.helpers.platform import add_tenant, make_platform
from tuneforge.db.repos import tenants as tenant_repo
from tuneforge.db.tables import Job
from tuneforge.domain.job_config import JobRequest
from tuneforge.domain.resolved import ResolvedJob, ResolvedResources
from tuneforge.domain.spec import Hyperparameters


def _job(tenant_id: str, request: JobRequest) -> Job:
    return Job(job_id="ftjob-typed", tenant_id=tenant_id, model="tiny-base", base_model_sha256="0" * 64,
               training_file="file-x", status="queued", attempt=0, seed=1, request=request, result_files=[],
               request_hash="0" * 64, created_at=0)


def test_typed_values_are_stored_as_json_and_read_back_equal(tmp_path, database_url):
    platform = make_platform(tmp_path, database_url)
    add_tenant(platform, "alpha")
    request = JobRequest.model_validate({"model": "tiny-base", "training_file": "file-x",
                                         "method": {"type": "dpo", "dpo": {"hyperparameters": {"beta": 0.3}}}})
    resolved = ResolvedJob(method="dpo",
                           hyperparameters=Hyperparameters(micro_batch_size=4, method_options={"beta": 0.3}),
                           resources=ResolvedResources(gpus=2))
    try:
        with platform.db.session() as session:
            job = _job(tenant_repo.by_name(session, "alpha").tenant_id, request)
            job.resolved = resolved
            session.add(job)
        with platform.db.session() as session:
            job = session.scalars(sa.select(Job).where(Job.job_id == "ftjob-typed")).one()
            assert job.request == request and job.request.method_type == "dpo"
            assert job.resolved == resolved
            stored = session.execute(sa.text("SELECT request, resolved FROM jobs WHERE job_id = 'ftjob-typed'")).one()
            # a replaced value is written (what the scheduler does after an out-of-memory attempt)
            job.resolved = dataclasses.replace(
                job.resolved, hyperparameters=dataclasses.replace(job.resolved.hyperparameters, micro_batch_size=2))
        with platform.db.session() as session:
            job = session.scalars(sa.select(Job).where(Job.job_id == "ftjob-typed")).one()
            assert job.resolved.hyperparameters.micro_batch_size == 2 and job.resolved.gpus == 2
        raw = [value if isinstance(value, dict) else json.loads(value) for value in stored]  # per driver
        assert raw[0] == request.to_json() and raw[1] == resolved.to_json()
    finally:
        platform.db.dispose()


def test_a_plain_dict_is_refused(tmp_path, database_url):
    platform = make_platform(tmp_path, database_url)
    add_tenant(platform, "alpha")
    try:
        with pytest.raises(StatementError, match="holds a ResolvedJob, not a dict"), \
                platform.db.session() as session:
            job = _job(tenant_repo.by_name(session, "alpha").tenant_id,
                       JobRequest(model="tiny-base", training_file="file-x"))
            job.resolved = {"hyperparameters": {}}  # type: ignore[assignment]
            session.add(job)
    finally:
        platform.db.dispose()
