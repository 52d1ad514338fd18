"""A node lost mid-attempt: the attempt is lost at once (not after the lease),
the job is requeued by the scheduler, resumes from its newest checkpoint on the
other node, and finishes; the lost node's trainers are gone with it.

The cluster is this test's own (a head without GPUs and two workers with 2
logical GPUs each), since one of its nodes is killed.
"""

from __future__ import annotations

import re

import pytest

from tests.e2e.conftest import start_plane
from tests.e2e.test_lifecycle import wait_for
from tests.e2e.test_restart import trainer_pids
from tests.helpers import ray_cluster
from tests.helpers.net import wait_until
from tests.helpers.s3 import S3Storage
from tuneforge.db.repos import attempts as attempt_repo
from tuneforge.demo.dataset import DEMO_HYPERPARAMETERS, DEMO_LORA, write_demo_files
from tuneforge.storage import layout

pytestmark = pytest.mark.ray
JOB_TIMEOUT_S = 600
# half the demo's epochs: what is checked is where the job resumes and that it ends, not what it learns
HYPERPARAMETERS = {**DEMO_HYPERPARAMETERS, "n_epochs": DEMO_HYPERPARAMETERS["n_epochs"] // 2}


@pytest.fixture
def cluster():
    test_cluster = ray_cluster.start_cluster(head_gpus=0, worker_gpus=[2, 2])
    yield test_cluster
    test_cluster.shutdown()


def checkpoint_steps(storage: S3Storage, prefix: str) -> list[int]:
    """Steps of the checkpoints in the bucket that have their manifest (the valid ones)."""
    listed = storage.client().list_objects_v2(Bucket=storage.bucket, Prefix=f"{storage.prefix}/{prefix}/")
    steps = []
    for item in listed.get("Contents", []):
        folder, _, name = item["Key"].rpartition("/")
        step = layout.checkpoint_step(folder)
        if name == layout.MANIFEST_NAME and step is not None:
            steps.append(step)
    return sorted(steps)


def test_a_lost_node_makes_the_attempt_lost_and_the_job_resumes_on_the_other_node(
        tmp_path, database_url, tiny_model_dir, s3_storage, cluster):
    nodes_root = tmp_path / "nodes"
    settings = ray_cluster.plane_settings(cluster, s3_storage, nodes_root, namespace="tf-node-loss")
    world = start_plane(tmp_path, database_url, tiny_model_dir, **settings)
    try:
        sdk = world.sdk(world.key_a)
        files = write_demo_files(tmp_path / "data")
        training = sdk.files.create(file=files.training_path.open("rb"), purpose="fine-tune")
        job = sdk.fine_tuning.jobs.create(
            model="tiny-chat", training_file=training.id, seed=0,
            method={"type": "supervised", "supervised": {"hyperparameters": HYPERPARAMETERS}},
            extra_body={"training_type": {"type": "lora", **DEMO_LORA}, "resources": {"gpus": 2},
                        "checkpointing": {"every_steps": 10, "keep_last": 20}})
        prefix = layout.checkpoints_prefix(job.organization_id, job.id)
        wait_until(lambda: checkpoint_steps(s3_storage, prefix), 180, "a first checkpoint")

        with world.plane.platform.db.session() as session:
            [first] = attempt_repo.for_job(session, job.organization_id, job.id)
            lost_node = first.placement["node"]
        survivor = next(node for node in cluster.worker_ids() if node != lost_node)
        assert trainer_pids(nodes_root / lost_node)  # its two ranks run there
        cluster.remove_worker(lost_node)
        # the node's trainers died with it: nothing can write a checkpoint any more
        wait_until(lambda: not trainer_pids(nodes_root / lost_node), 30, "the lost node's trainers")
        newest = checkpoint_steps(s3_storage, prefix)[-1]

        done = wait_for(sdk, job.id, timeout_s=JOB_TIMEOUT_S)
        assert done.status == "succeeded", done.error
        with world.plane.platform.db.session() as session:
            rows = [(a.number, a.status, a.failure_class, a.placement["node"])
                    for a in attempt_repo.for_job(session, job.organization_id, job.id)]
        assert rows == [(1, "lost", "platform", lost_node), (2, "succeeded", None, survivor)]

        messages = [e.message for e in sdk.fine_tuning.jobs.list_events(job.id, limit=100)]
        [restart] = [m for m in messages if m.startswith("Attempt 1 ended")]
        assert re.search(r"a node of the attempt was lost", restart), restart
        resumed = [int(m.rsplit(" ", 1)[1]) for m in messages if m.startswith("resumed from the checkpoint at step")]
        assert resumed == [newest]  # the newest checkpoint written before the loss, none lost
        metrics = [e.data for e in sdk.fine_tuning.jobs.list_events(job.id, limit=100) if e.type == "metrics"]
        assert max(m["step"] for m in metrics) == done.model_extra["estimate"]["steps"]
    finally:
        world.close()
