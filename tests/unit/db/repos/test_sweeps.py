"""Sweeps and their trials are read only with the sweep's tenant: another tenant's id finds
nothing, even given the right sweep, trial or job ids; the scheduler's platform-side pass sees
every tenant's running sweeps."""

from __future__ import annotations

import time

from tests.helpers.platform import add_tenant, make_platform
from tests.unit.api.test_usage import add_attempt, add_job
from tuneforge.db.repos import attempts as attempt_repo
from tuneforge.db.repos import checkpoints as checkpoint_repo
from tuneforge.db.repos import jobs as job_repo
from tuneforge.db.repos import models as model_repo
from tuneforge.db.repos import sweeps as sweep_repo
from tuneforge.db.repos import tenants as tenant_repo
from tuneforge.db.tables import Checkpoint, FineTunedModel, Sweep, SweepTrial

CONFIG = {"sampler": "grid", "max_trials": 2, "max_parallel": 2, "objective": {}, "early_stopping": None,
          "search_space": {}, "seed": 0, "job": {}}


def add_sweep(session, tenant_id: str, sweep_id: str, status: str, job_ids: list[str]) -> None:
    session.add(Sweep(sweep_id=sweep_id, tenant_id=tenant_id, status=status, config=CONFIG, created_at=1))
    session.flush()
    for number, job_id in reversed(list(enumerate(job_ids))):  # stored out of order: read back by number
        session.add(SweepTrial(sweep_id=sweep_id, number=number, job_id=job_id, params={"lr": number},
                               status="running", rungs=[], created_at=1))


def test_another_tenants_sweep_and_trial_ids_return_nothing(tmp_path, database_url):
    platform = make_platform(tmp_path, database_url)
    add_tenant(platform, "owner")
    add_tenant(platform, "other")
    first, second = add_job(platform, "owner", "running"), add_job(platform, "owner", "succeeded")
    theirs = add_job(platform, "other", "running")
    now = time.time()
    add_attempt(platform, first, 1, started_at=now - 60, ended_at=now - 30, status="lost")
    add_attempt(platform, first, 2, started_at=now - 20, ended_at=None, status="running")
    add_attempt(platform, theirs, 1, started_at=now - 20, ended_at=None, status="running")
    with platform.db.session() as session:
        owner = tenant_repo.by_name(session, "owner").tenant_id
        other = tenant_repo.by_name(session, "other").tenant_id
        add_sweep(session, owner, "sweep-a", "running", [first, second])
        add_sweep(session, owner, "sweep-b", "succeeded", [])
        add_sweep(session, other, "sweep-c", "running", [theirs])
        session.add(Checkpoint(checkpoint_id="ftckpt-1", job_id=second, step=20, attempt=1, epoch=2.0,
                               prefix="p/step-20", metrics={"valid_loss": 0.4}, created_at=int(now)))
        session.add(Checkpoint(checkpoint_id="ftckpt-0", job_id=second, step=10, attempt=1, epoch=1.0,
                               prefix="p/step-10", metrics={"valid_loss": 0.7}, created_at=int(now)))
        session.add(Checkpoint(checkpoint_id="ftckpt-m", job_id=second, step=15, attempt=1, epoch=None,
                               prefix="p/step-15", metrics={"valid_loss": 0.5}, created_at=int(now)))
        session.add(FineTunedModel(model_id="ft:tiny:owner:1", tenant_id=owner, job_id=second, base_model="tiny",
                                   base_model_sha256="0" * 64, artifact_prefix="p/a", created_at=int(now)))

    with platform.db.session() as session:
        assert sweep_repo.get(session, owner, "sweep-a").status == "running"
        assert [s.sweep_id for s in sweep_repo.of_tenant(session, owner, 10)] == ["sweep-b", "sweep-a"]
        assert [s.sweep_id for s in sweep_repo.of_tenant(session, owner, 1)] == ["sweep-b"]
        assert [(t.number, t.job_id) for t in sweep_repo.trials(session, owner, "sweep-a")] == \
            [(0, first), (1, second)]
        assert sorted(job_repo.get_many(session, owner, [first, second, theirs])) == sorted([first, second])
        assert [(a.job_id, a.number) for a in attempt_repo.for_jobs(session, owner, [first, theirs])] == \
            [(first, 1), (first, 2)]
        assert checkpoint_repo.epoch_metrics(session, owner, second) == \
            [(1.0, {"valid_loss": 0.7}), (2.0, {"valid_loss": 0.4})]  # by step; mid-epoch ones left out
        assert model_repo.of_job(session, owner, second).model_id == "ft:tiny:owner:1"

        # the same reads as the other tenant, with the owner's ids: nothing, not an error
        assert sweep_repo.get(session, other, "sweep-a") is None
        assert [s.sweep_id for s in sweep_repo.of_tenant(session, other, 10)] == ["sweep-c"]
        assert sweep_repo.trials(session, other, "sweep-a") == []
        assert job_repo.get_many(session, other, [first, second]) == {}
        assert attempt_repo.for_jobs(session, other, [first, second]) == []
        assert checkpoint_repo.epoch_metrics(session, other, second) == []
        assert model_repo.of_job(session, other, second) is None
        assert job_repo.get_many(session, owner, []) == {} and attempt_repo.for_jobs(session, owner, []) == []

        # the scheduler's pass: every tenant's running sweeps, oldest first; the lookup is platform-side
        assert sweep_repo.running_ids(session) == ["sweep-a", "sweep-c"]
        assert sweep_repo.get_for_update(session, "sweep-c").tenant_id == other
        assert sweep_repo.get_for_update(session, "sweep-x") is None
