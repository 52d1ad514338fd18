"""The Ray executor on a real Ray cluster of this host: a head with 4 logical GPUs
(`ray start --head --num-gpus=4`) and two worker nodes with 2 each, built with
Ray's multi-node test utility. Control plane on PostgreSQL or SQLite, objects
in S3 (moto): trainers reach nothing of the control plane's but its HTTP API
and the bucket.

- a 2-GPU job lands on one node (a 2-GPU worker: the fullest that fits), trains
  data-parallel there and learns; a second job on that node finds the base
  model in the node's cache;
- a 4-GPU single-node job waits while the 4-GPU head is busy with other work
  (never split over the two workers) and a 2-GPU job backfills; it starts on
  the head once the head is free;
- a 2-node job spans both workers, one process group across them, and learns.

Node loss is in tests/integration/test_ray_node_loss.py (a cluster of its own).
"""

from __future__ import annotations

import uuid

import openai
import pytest

from tests.e2e.conftest import start_plane
from tests.e2e.test_lifecycle import wait_for
from tests.helpers import ray_cluster
from tests.helpers.net import wait_until
from tuneforge.db.repos import attempts as attempt_repo
from tuneforge.db.repos import jobs as job_repo
from tuneforge.demo.dataset import DEMO_HYPERPARAMETERS, DEMO_LORA, write_demo_files

pytestmark = pytest.mark.ray
JOB_TIMEOUT_S = 600
# A job that must train to its end here is checked for where it ran and that it learned (its last
# loss under half its first): 15 of the demo's 50 epochs (45 steps) do that with a wide margin (the
# last loss ~0.13 of the first in one process, the same global batch as on two ranks), at a third
# of the steps.
LEARNS_EPOCHS = 15


@pytest.fixture(scope="module")
def cluster():
    test_cluster = ray_cluster.start_cluster(head_gpus=4, worker_gpus=[2, 2])
    yield test_cluster
    test_cluster.shutdown()


@pytest.fixture
def world(tmp_path, database_url, tiny_model_dir, s3_storage, cluster):
    namespace = f"tf-{uuid.uuid4().hex[:8]}"
    settings = ray_cluster.plane_settings(cluster, s3_storage, tmp_path / "nodes", namespace=namespace)
    running = start_plane(tmp_path, database_url, tiny_model_dir, **settings)
    running.namespace = namespace
    running.cluster = cluster
    running.sdk_a = running.sdk(running.key_a)
    files = write_demo_files(tmp_path / "data")
    running.files = files
    running.training = running.sdk_a.files.create(file=files.training_path.open("rb"), purpose="fine-tune").id
    running.validation = running.sdk_a.files.create(file=files.validation_path.open("rb"), purpose="fine-tune").id
    yield running
    running.close()  # frees what the test left running before the next test looks at the cluster


def create_job(world, resources: dict, *, n_epochs: int | None = None):
    hyperparameters = dict(DEMO_HYPERPARAMETERS, **({"n_epochs": n_epochs} if n_epochs else {}))
    return world.sdk_a.fine_tuning.jobs.create(
        model="tiny-chat", training_file=world.training, validation_file=world.validation, seed=0,
        method={"type": "supervised", "supervised": {"hyperparameters": hyperparameters}},
        extra_body={"training_type": {"type": "lora", **DEMO_LORA}, "checkpointing": {"every_steps": 30},
                    "resources": resources})


def attempts(world, job_id: str):
    with world.plane.platform.db.session() as session:
        tenant_id = job_repo.get_for_update(session, job_id).tenant_id
        return [(a.number, a.status, dict(a.placement or {}), dict(a.handle or {}))
                for a in attempt_repo.for_job(session, tenant_id, job_id)]


def started_events(sdk: openai.OpenAI, job_id: str) -> list[dict]:
    return [e.data for e in sdk.fine_tuning.jobs.list_events(job_id, limit=100)
            if e.message.startswith("attempt ") and " started on " in e.message]


def losses(sdk: openai.OpenAI, job_id: str) -> list[float]:
    metrics = [e.data for e in sdk.fine_tuning.jobs.list_events(job_id, limit=100) if e.type == "metrics"]
    return [m["train_loss"] for m in sorted(metrics, key=lambda m: m["step"])]


def test_a_two_gpu_job_lands_on_one_node_and_a_second_finds_the_base_model_cached(world, tmp_path):
    sdk = world.sdk_a
    first = create_job(world, {"gpus": 2}, n_epochs=LEARNS_EPOCHS)
    running = wait_for(sdk, first.id, statuses=("running",), timeout_s=60)
    assert running.status == "running"
    groups = wait_until(lambda: ray_cluster.placement_groups(world.namespace), 30, "the placement group")
    assert len(groups) == 1 and groups[0]["strategy"] == "STRICT_PACK"
    assert list(groups[0]["bundles"].values()) == [{"GPU": 2.0, "CPU": 2.0}]

    done = wait_for(sdk, first.id, timeout_s=JOB_TIMEOUT_S)
    assert done.status == "succeeded", done.error
    [(number, status, placement, handle)] = attempts(world, first.id)
    node = placement["node"]
    assert placement["spans"] == {node: [0, 1]}
    assert node in world.cluster.worker_ids()  # the fullest node that fits: a 2-GPU worker, not the head
    assert set(groups[0]["bundles_to_node_id"].values()) == {node}
    [started] = started_events(sdk, first.id)
    assert started["node"] == node and started["world_size"] == 2
    assert started["base_model_cache"] == "downloaded"
    trained = losses(sdk, first.id)
    assert trained[-1] < trained[0] * 0.5
    # both ranks were forked from the node's warm trainer, which the first one waited for
    rank_logs = sorted((tmp_path / "nodes" / node).glob("attempts/*/rank-*.log"))
    assert [log.name for log in rank_logs] == ["rank-0.log", "rank-1.log"]
    for log in rank_logs:
        assert "forked from the node's warm trainer" in log.read_text(errors="replace"), log.read_text()[-2000:]
    # the attempt's placement group is gone once its end is recorded
    wait_until(lambda: not [g for g in ray_cluster.placement_groups(world.namespace)
                                      if g["state"] != "REMOVED"], 30, "the placement group's removal")

    second = create_job(world, {"gpus": 2}, n_epochs=2)
    done = wait_for(sdk, second.id, timeout_s=JOB_TIMEOUT_S)
    assert done.status == "succeeded", done.error
    [(_n, _s, placement, _h)] = attempts(world, second.id)
    assert placement["node"] == node  # the same choice on the same free cluster
    [started] = started_events(sdk, second.id)
    assert started["base_model_cache"] == "hit"
    cached = tmp_path / "nodes" / node / "base-models"
    assert [p.name for p in cached.iterdir() if not p.name.startswith(".")] == [done.model_extra["base_model_sha256"]]
    wait_until(lambda: not [g for g in ray_cluster.placement_groups(world.namespace)
                                      if g["state"] != "REMOVED"], 30, "the placement group's removal")
    others = [tmp_path / "nodes" / other / "base-models" for other in world.cluster.worker_ids() if other != node]
    assert not any(path.exists() and any(path.iterdir()) for path in others)


@pytest.fixture
def busy_head(world):
    """The head's 4 GPUs taken by work outside tuneforge: a placement group of someone else's."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    group = placement_group([{"GPU": 4.0}], strategy="STRICT_PACK", name="someone-else",
                            bundle_label_selector=[{"ray.io/node-id": world.cluster.head_id}])
    ray.get(group.ready(), timeout=30)
    holder = {"group": group}

    def free() -> None:
        if holder["group"] is not None:
            remove_placement_group(holder["group"])
            holder["group"] = None

    world.free_head = free
    yield group
    free()


def test_a_single_node_job_waits_unsplit_while_a_smaller_job_backfills(world, busy_head):
    sdk = world.sdk_a
    head = world.cluster.head_id
    capacity = {n.name: n for n in world.plane.platform.inventory.nodes}
    wait_until(lambda: {n.name: n.free_gpus for n in world.plane.platform.inventory.nodes}[head] == 0,
                         10, "the scheduler to see the head busy")
    assert capacity[head].total_gpus == 4

    big = create_job(world, {"gpus": 4, "nodes": 1}, n_epochs=50)
    small = create_job(world, {"gpus": 2}, n_epochs=50)
    wait_for(sdk, small.id, statuses=("running",), timeout_s=60)
    [(_n, _s, placement, _h)] = attempts(world, small.id)
    assert placement["node"] in world.cluster.worker_ids()  # backfilled behind the big job

    # 4 GPUs are free on the two workers together, but the job asked for one node: it waits
    assert sdk.fine_tuning.jobs.retrieve(big.id).status == "queued"
    assert attempts(world, big.id) == []
    assert {g["name"] for g in ray_cluster.placement_groups(world.namespace)} == \
        {f"{world.namespace}:{small.id}:1"}

    world.free_head()
    wait_for(sdk, big.id, statuses=("running",), timeout_s=60)
    [(_n, _s, placement, _h)] = attempts(world, big.id)
    assert placement["spans"] == {head: [0, 1, 2, 3]}
    group = wait_until(
        lambda: [g for g in ray_cluster.placement_groups(world.namespace)
                 if g["name"].endswith(f":{big.id}:1") and g["state"] == "CREATED"], 30, "the big job's group")[0]
    assert group["strategy"] == "STRICT_PACK" and set(group["bundles_to_node_id"].values()) == {head}
    started = wait_until(lambda: started_events(sdk, big.id), 120, "the big job's trainer")[0]
    assert started["node"] == head and started["world_size"] == 4
    assert sdk.fine_tuning.jobs.cancel(big.id).status == "cancelled"
    # the small job may have finished its epochs while the big one's four ranks started
    if sdk.fine_tuning.jobs.retrieve(small.id).status not in ("succeeded", "failed", "cancelled"):
        try:
            sdk.fine_tuning.jobs.cancel(small.id)
        except openai.BadRequestError as exc:
            assert exc.code == "job_not_cancellable"
    wait_until(lambda: not [g for g in ray_cluster.placement_groups(world.namespace)
                                      if g["state"] != "REMOVED"], 60, "the cancelled jobs' groups to go")


def test_a_two_node_job_spans_both_workers_in_one_process_group_and_learns(world, busy_head, tmp_path):
    sdk = world.sdk_a
    job = create_job(world, {"gpus": 4, "nodes": 2}, n_epochs=LEARNS_EPOCHS)
    wait_for(sdk, job.id, statuses=("running",), timeout_s=60)
    group = wait_until(lambda: ray_cluster.placement_groups(world.namespace), 30, "the group")[0]
    assert group["strategy"] == "STRICT_SPREAD"
    assert sorted(group["bundles_to_node_id"].values()) == sorted(world.cluster.worker_ids())
    done = wait_for(sdk, job.id, timeout_s=JOB_TIMEOUT_S)
    assert done.status == "succeeded", done.error
    [(_n, _s, placement, handle)] = attempts(world, job.id)
    assert {name: len(ids) for name, ids in placement["spans"].items()} == \
        {node: 2 for node in world.cluster.worker_ids()}
    assert handle["ranks"] == [2, 2] and handle["nodes"][0] == placement["node"]
    [started] = started_events(sdk, job.id)  # rank 0 alone reports, on the first node
    assert started["world_size"] == 4 and started["node"] == placement["node"]
    trained = losses(sdk, job.id)
    assert trained[-1] < trained[0] * 0.5
    # every node fetched the base model into its own cache for its ranks
    for node in world.cluster.worker_ids():
        cached = tmp_path / "nodes" / node / "base-models" / done.model_extra["base_model_sha256"]
        assert (cached / "config.json").is_file()


def test_a_placement_group_that_cannot_be_reserved_is_removed_and_the_launch_fails(
        world, busy_head, tmp_path, tiny_model_dir):
    from dataclasses import replace

    from tests.helpers.tiny import stage_job
    from tuneforge.executors.protocol import Placement

    executor = world.plane.executor
    spec, _store = stage_job(tmp_path / "staged", tiny_model_dir, job_id="ftjob-unplaceable")
    executor.settings = executor.settings.model_copy(update={"ray_placement_timeout_s": 2.0})
    try:
        with pytest.raises(RuntimeError, match=r"was not ready within 2 s"):
            executor.launch(replace(spec, gpus=4), Placement(world.cluster.head_id, [0, 1, 2, 3]))
    finally:
        executor.settings = world.plane.settings
    wait_until(lambda: all(g["state"] == "REMOVED" for g in ray_cluster.placement_groups(world.namespace)),
               30, "the unready group's removal")
    assert [g["name"] for g in ray_cluster.placement_groups(world.namespace)] == \
        [f"{world.namespace}:ftjob-unplaceable:1"]
