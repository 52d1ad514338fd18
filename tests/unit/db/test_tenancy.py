"""A job's child rows (attempts, events, checkpoints) are read only together with the job's
tenant: the same read with another tenant's id finds nothing, even given the right job id."""

from __future__ import annotations

import time

from tests.helpers.platform import add_tenant, make_platform
from tests.unit.api.test_usage import add_attempt, add_job
from tuneforge.db.repos import attempts as attempt_repo
from tuneforge.db.repos import checkpoints as checkpoint_repo
from tuneforge.db.repos import events as event_repo
from tuneforge.db.repos import jobs as job_repo
from tuneforge.db.repos import tenants as tenant_repo
from tuneforge.db.tables import Checkpoint


def test_reads_of_a_jobs_children_with_another_tenants_id_return_nothing(tmp_path, database_url):
    platform = make_platform(tmp_path, database_url)
    try:
        add_tenant(platform, "owner")
        add_tenant(platform, "other")
        job_id = add_job(platform, "owner", "running")
        now = time.time()
        add_attempt(platform, job_id, 1, started_at=now - 60, ended_at=now - 30, status="lost")
        add_attempt(platform, job_id, 2, started_at=now - 20, ended_at=None, status="running")
        with platform.db.session() as session:
            owner = tenant_repo.by_name(session, "owner").tenant_id
            other = tenant_repo.by_name(session, "other").tenant_id
            job = job_repo.get(session, owner, job_id)
            event_repo.add(session, job, "started")
            event_repo.add(session, job, "step 1", event_type="metrics", data={"step": 1}, attempt=2, seq=1)
            session.add(Checkpoint(checkpoint_id="ftckpt-1", job_id=job_id, step=10, attempt=2,
                                   prefix="tenants/x/jobs/y/checkpoints/step-10", metrics={}, created_at=int(now)))

        with platform.db.session() as session:
            assert [a.number for a in attempt_repo.for_job(session, owner, job_id)] == [1, 2]
            assert attempt_repo.current(session, owner, job_id, 2).status == "running"
            assert [e.message for e in event_repo.page(session, owner, job_id, after=None, limit=10).rows] == \
                ["step 1", "started"]
            assert [e.message for e in event_repo.since(session, owner, job_id, 0)] == ["started", "step 1"]
            assert [e.message for e in event_repo.metrics_rows(session, owner, job_id)] == ["step 1"]
            assert event_repo.reported_seqs(session, owner, job_id, 2, [1, 2]) == {1}
            assert [c.step for c in checkpoint_repo.for_job(session, owner, job_id)] == [10]
            assert checkpoint_repo.at_step(session, owner, job_id, 10).checkpoint_id == "ftckpt-1"
            assert [c.step for c in checkpoint_repo.page(session, owner, job_id, after=None, limit=10).rows] == [10]
            assert job_repo.status_of(session, owner, job_id) == "running"

            # the same reads as the other tenant: nothing, not an error
            assert attempt_repo.for_job(session, other, job_id) == []
            assert attempt_repo.current(session, other, job_id, 2) is None
            events_page = event_repo.page(session, other, job_id, after=None, limit=10)
            assert (list(events_page.rows), events_page.has_more) == ([], False)
            assert event_repo.since(session, other, job_id, 0) == []
            assert event_repo.metrics_rows(session, other, job_id) == []
            assert event_repo.reported_seqs(session, other, job_id, 2, [1, 2]) == set()
            assert checkpoint_repo.for_job(session, other, job_id) == []
            assert checkpoint_repo.at_step(session, other, job_id, 10) is None
            assert list(checkpoint_repo.page(session, other, job_id, after=None, limit=10).rows) == []
            assert job_repo.status_of(session, other, job_id) is None

            # the scheduler's scans over every tenant name the tenant of each attempt
            assert [(tenant_id, a.number) for tenant_id, a in attempt_repo.ended_since(session, now - 3600)] == \
                [(owner, 1)]
    finally:
        platform.db.dispose()
