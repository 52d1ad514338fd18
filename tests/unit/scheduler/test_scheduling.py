"""The scheduler loop with the policy: gang placement over nodes, preemption for premium, queue view."""

from __future__ import annotations

import io
import time

import pytest
from fastapi.testclient import TestClient

from tests.helpers.platform import add_base_model, add_tenant, chat_lines, make_platform
from tests.unit.scheduler.test_loop import FakeExecutor
from tuneforge.api.app import create_app
from tuneforge.db.repos import attempts as attempt_repo
from tuneforge.db.repos import jobs as job_repo
from tuneforge.domain.exit_codes import TrainerExit
from tuneforge.executors.protocol import Capacity, NodeCapacity, PollResult
from tuneforge.scheduler.loop import Scheduler


class NodesExecutor(FakeExecutor):
    def __init__(self, nodes: int, gpus: int) -> None:
        super().__init__(gpus=nodes * gpus)
        self.layout = [(f"node-{i}", gpus) for i in range(nodes)]
        self.placements = []

    def capacity(self) -> Capacity:
        return Capacity([NodeCapacity(name, gpus, gpus) for name, gpus in self.layout])

    def launch(self, spec, placement):
        self.placements.append(placement)
        return super().launch(spec, placement)


@pytest.fixture
def world(tmp_path, database_url, tiny_model_dir):
    platform = make_platform(tmp_path, database_url, retry_backoff_s=0.0, premium_target_wait_s=300.0)
    add_base_model(platform, "tiny-base", tiny_model_dir)
    keys = {tier: add_tenant(platform, f"{tier}-co", tier) for tier in ("free", "standard", "premium")}
    http = TestClient(create_app(platform=platform))
    executor = NodesExecutor(nodes=2, gpus=2)
    scheduler = Scheduler(platform, executor)
    platform.inventory = executor.capacity()  # as the running scheduler reports it
    files = {}
    for tier, key in keys.items():
        files[tier] = http.post("/v1/files", files={"file": ("t.jsonl", io.BytesIO(chat_lines(20)))},
                                data={"purpose": "fine-tune"}, headers={"Authorization": f"Bearer {key}"}).json()["id"]

    def create(tier: str, gpus: int, **resources) -> str:
        body = {"model": "tiny-base", "training_file": files[tier], "resources": {"gpus": gpus, **resources}}
        response = http.post("/v1/fine_tuning/jobs", json=body, headers={"Authorization": f"Bearer {keys[tier]}"})
        assert response.status_code == 200, response.text
        return response.json()["id"]

    def get(tier: str, job_id: str) -> dict:
        return http.get(f"/v1/fine_tuning/jobs/{job_id}", headers={"Authorization": f"Bearer {keys[tier]}"}).json()

    yield platform, scheduler, executor, create, get
    http.close()
    platform.db.dispose()


def test_gang_placement_over_two_nodes_never_splits_a_job(world):
    _platform, scheduler, executor, create, get = world
    first, second, third = create("standard", 2), create("standard", 2), create("standard", 1)
    scheduler.tick()
    assert get("standard", first)["status"] == "running" and get("standard", second)["status"] == "running"
    assert {p.node for p in executor.placements} == {"node-0", "node-1"}
    assert all(len(p.gpu_ids) == 2 and list(p.spans) == [p.node] for p in executor.placements)
    waiting = get("standard", third)
    assert waiting["status"] == "queued"
    assert waiting["queue"]["position"] == 1 and waiting["queue"]["estimated_start"] > time.time()


def test_a_premium_job_past_its_target_preempts_lower_tier_work(world):
    platform, scheduler, executor, create, get = world
    low = [create("free", 2), create("standard", 2)]
    scheduler.tick()
    assert all(get(tier, job)["status"] == "running" for tier, job in zip(("free", "standard"), low))
    urgent = create("premium", 2)
    scheduler.tick()
    assert executor.signals == []  # within its target wait: no preemption yet
    with platform.db.session() as session:
        job_repo.get_for_update(session, urgent).created_at -= 400  # waited past the 300 s target
    free_pid = 1 + [spec.job_id for spec in executor.launched].index(low[0])
    scheduler.tick()
    assert executor.signals == [(free_pid, "preempt")]  # the free-tier job, and only one
    scheduler.tick()
    assert executor.signals == [(free_pid, "preempt")]  # not asked twice while it checkpoints
    executor.states[free_pid] = PollResult("exited", int(TrainerExit.PREEMPTED))
    scheduler.tick()
    assert get("premium", urgent)["status"] == "running"
    assert get("free", low[0])["status"] == "queued"  # requeued, resumes later from its checkpoint
    with platform.db.session() as session:
        preempted = job_repo.get_for_update(session, low[0])
        assert attempt_repo.current(session, preempted.tenant_id, low[0], 1).failure_class == "preempted"


def test_a_job_larger_than_any_node_is_rejected_at_validation(world):
    _platform, _scheduler, _executor, create, get = world
    job_id = create("standard", 3)  # nodes have 2 GPUs; below the multi-node size, so it needs one node
    failed = get("standard", job_id)
    assert failed["status"] == "failed" and failed["error"]["code"] == "resources_unavailable"
    assert "resources.gpus" in failed["error"]["message"]


def test_gpus_freed_for_a_premium_job_go_to_it_not_to_a_job_ahead_of_it(world):
    platform, scheduler, executor, create, get = world
    low = [create("free", 2), create("standard", 2)]
    scheduler.tick()
    aged = create("standard", 2)  # queued for 14 h: ranks ahead of a fresh premium job (12 h per tier)
    urgent = create("premium", 2)
    with platform.db.session() as session:
        job_repo.get_for_update(session, aged).created_at -= 14 * 3600
        job_repo.get_for_update(session, urgent).created_at -= 400
    scheduler.tick()
    free_pid = 1 + [spec.job_id for spec in executor.launched].index(low[0])
    assert executor.signals == [(free_pid, "preempt")]
    executor.states[free_pid] = PollResult("exited", int(TrainerExit.PREEMPTED))
    scheduler.tick()
    assert get("premium", urgent)["status"] == "running"  # on the GPUs held for it
    assert get("standard", aged)["status"] == "queued"
    assert executor.placements[-1].node == executor.placements[[s.job_id for s in executor.launched].index(low[0])].node


def test_resources_nodes_spreads_a_job_evenly_or_keeps_it_on_one_node(world):
    _platform, scheduler, executor, create, get = world
    spread = create("standard", 4, nodes=2)
    scheduler.tick()
    assert get("standard", spread)["status"] == "running"
    [placement] = executor.placements
    assert {name: len(ids) for name, ids in placement.spans.items()} == {"node-0": 2, "node-1": 2}
    assert placement.node in placement.spans  # rank 0's node, one of the two

    one_node = create("standard", 4, nodes=1)  # 4 GPUs on one node: no node has 4
    scheduler.tick()
    failed = get("standard", one_node)
    assert failed["status"] == "failed" and failed["error"]["code"] == "resources_unavailable"
    assert "all of them on one node" in failed["error"]["message"]


def test_resources_nodes_must_divide_the_gpus(world):
    platform, _scheduler, _executor, _create, _get = world
    from fastapi.testclient import TestClient

    from tuneforge.api.app import create_app

    key = add_tenant(platform, "uneven-co")
    http = TestClient(create_app(platform=platform))
    auth = {"Authorization": f"Bearer {key}"}
    file_id = http.post("/v1/files", files={"file": ("t.jsonl", io.BytesIO(chat_lines(20)))},
                        data={"purpose": "fine-tune"}, headers=auth).json()["id"]
    response = http.post("/v1/fine_tuning/jobs", headers=auth, json={
        "model": "tiny-base", "training_file": file_id, "resources": {"gpus": 3, "nodes": 2}})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "resources.nodes"
    assert "split evenly" in response.json()["error"]["message"]


def test_the_scheduler_starts_at_most_max_concurrent_jobs_of_a_tenant_and_does_not_hold_at_the_hard_cap(world):
    platform, scheduler, _executor, create, get = world
    from tuneforge.services.tenancy import tenants as tenant_service

    free = [create("free", 1), create("free", 1)]  # free tier: one job at a time
    standard = create("standard", 1)
    with platform.db.session() as session:  # the cap counts from 0 GPU-hours: reached
        tenant_service.set_quota(session, "standard-co", {"gpu_hours_hard": 0.0})
    scheduler.tick()  # 4 free GPUs: room for all three
    assert sorted(get("free", job)["status"] for job in free) == ["queued", "running"]
    assert get("standard", standard)["status"] == "running"  # admitted under the cap: it starts
    scheduler.tick()
    assert sorted(get("free", job)["status"] for job in free) == ["queued", "running"]
    with platform.db.session() as session:
        tenant_service.set_quota(session, "free-co", {"max_concurrent_jobs": 2})
    scheduler.tick()
    assert [get("free", job)["status"] for job in free] == ["running", "running"]
