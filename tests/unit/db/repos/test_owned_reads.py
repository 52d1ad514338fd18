"""Reads of tenant-owned rows that services, the scheduler's validation, the registry and the lean
API paths call: the owner finds its rows, the same read with another tenant's id finds nothing."""

from __future__ import annotations

import asyncio
import time

from tests.helpers.platform import add_tenant, make_platform
from tests.unit.api.test_usage import add_attempt, add_job
from tuneforge.db.repos import events as event_repo
from tuneforge.db.repos import jobs as job_repo
from tuneforge.db.repos import models as model_repo
from tuneforge.db.repos import tenants as tenant_repo
from tuneforge.db.repos import usage as usage_repo
from tuneforge.db.repos.lean_reads import JOB_ROWS, EventReads, JobReads
from tuneforge.db.tables import FineTunedModel, ModelStageChange


def _model(tenant_id: str, job_id: str, model_id: str) -> FineTunedModel:
    return FineTunedModel(model_id=model_id, tenant_id=tenant_id, job_id=job_id, base_model="tiny-base",
                          base_model_sha256="0" * 64, artifact_prefix=f"tenants/{tenant_id}/{model_id}",
                          config_hash="c" * 64, created_at=int(time.time()))


def test_tenant_reads_find_the_owners_rows_and_nothing_of_another_tenant(tmp_path, database_url):
    platform = make_platform(tmp_path, database_url)
    try:
        add_tenant(platform, "owner", tier="premium")
        add_tenant(platform, "other")
        first, second = add_job(platform, "owner", "queued"), add_job(platform, "owner", "running")
        now = time.time()
        add_attempt(platform, second, 1, started_at=now - 60, ended_at=None, status="running")
        with platform.db.session() as session:
            owner = tenant_repo.by_name(session, "owner").tenant_id
            other = tenant_repo.by_name(session, "other").tenant_id
            for job_id in (first, second):
                job_repo.get(session, owner, job_id).config_hash = "c" * 64
            session.add(_model(owner, second, "ft:owned"))
            session.flush()
            session.add(ModelStageChange(model_id="ft:owned", tenant_id=owner, from_stage="dev", to_stage="staging",
                                         actor="admin", created_at=int(now)))

        with platform.db.session() as session:
            assert tenant_repo.tier_of(session, owner) == "premium"
            assert job_repo.count_in(session, owner, ("queued", "running")) == 2
            assert job_repo.count_in(session, other, ("queued", "running")) == 0
            assert [job.job_id for job in job_repo.ending_with(session, owner, second[-6:])] == [second]
            assert job_repo.ending_with(session, other, second[-6:]) == []
            assert job_repo.first_twin(session, owner, "c" * 64, second).job_id == first
            assert job_repo.first_twin(session, other, "c" * 64, second) is None
            assert [job.job_id for _a, job in usage_repo.attempts_between(session, owner, now - 3600, now)] == \
                [second]
            assert usage_repo.attempts_between(session, other, now - 3600, now) == []
            assert model_repo.same_config(session, owner, "c" * 64).model_id == "ft:owned"
            assert model_repo.same_config(session, other, "c" * 64) is None
            assert model_repo.same_config(session, owner, "c" * 64, exclude_job=second) is None
            listed = model_repo.listing(session, owner, base_model=None, stage=None, include_deprecated=False)
            assert [row.model_id for row in listed] == ["ft:owned"]
            assert model_repo.listing(session, other, base_model=None, stage=None, include_deprecated=False) == []
            assert [c.to_stage for c in model_repo.stage_changes(session, owner, "ft:owned")] == ["staging"]
            assert model_repo.stage_changes(session, other, "ft:owned") == []
            job = job_repo.get(session, owner, second)
            event_repo.add(session, job, "started")

        jobs, events = JobReads(platform.db.engine), EventReads(platform.db.engine)

        async def all_reads(raw, tenant_id: str) -> tuple[list, list, list | None]:
            one = await jobs.one.rows(raw, tenant_id=tenant_id, job_id=second)
            page = await jobs.pages.rows(raw, None, 10, tenant_id=tenant_id)
            return one, page, await events.rows(raw, tenant_id, second, None, 10)

        def lean(tenant_id: str) -> tuple[list, list, list | None]:
            return asyncio.run(platform.db.reads.call(all_reads, tenant_id))

        one, page, found = lean(owner)
        assert [row[JOB_ROWS.index("job_id")] for row in one] == [second]
        assert [row[JOB_ROWS.index("job_id")] for row in page] == [second, first]
        assert [row[3] for row in found] == ["started"]
        assert lean(other) == ([], [], None)
    finally:
        platform.db.dispose()
