"""Ray clusters on this host for tests: a head and worker nodes with logical GPUs.

Built with Ray's multi-node test utility (`ray.cluster_utils.Cluster`): every
node is a real raylet with its own resources, so placement groups, node
labels and node loss behave as on a cluster. The head is what
`ray start --head --num-gpus=N` starts. Everything listens on 127.0.0.1:
`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0` (set in tests/conftest.py before Ray is
imported) keeps Ray from swapping 127.0.0.1 for the host's own address.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

EXECUTOR_ENV = "TUNEFORGE_TEST_EXECUTOR"  # "ray": scripts/test.sh's ray stage
LOOPBACK = "127.0.0.1"
CPUS_PER_NODE = 8  # logical: Ray's bookkeeping, not this host's cores
OBJECT_STORE_BYTES = 100 * 1024 * 1024
# How soon the cluster holds a node whose raylet stopped answering for dead: its health check
# every second, dead after 3 failed checks in a row (Ray's defaults: every 3 s, 5 failures, so a
# lost node's actors die ~15-20 s after it). A killed raylet refuses the check at once; a slow but
# live one still answers within Ray's 10 s timeout, so a loaded host does not lose nodes. An
# operator sets the same keys on `ray start` (`--system-config`).
HEALTH_CHECK = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}
# The environment the cluster's processes start with. The Ray Client server starts one process
# per connecting driver; with gRPC's fork handlers on, a fork while other threads are in gRPC
# ("skipping fork() handlers") sometimes leaves that process dead at birth, and the driver learns
# it ~45 s later (measured here under a load of 2: 10 of 60 connections failed with the handlers
# on, 0 of 56 with them off; in CI, the ray stage's first connection in 3 runs of 4).
# docs/operations.md tells operators the same for the head they start.
CLUSTER_ENV = {"GRPC_ENABLE_FORK_SUPPORT": "0"}


def ray_stage() -> bool:
    """Whether this pytest run is the ray stage (end-to-end tests on a Ray cluster)."""
    return os.environ.get(EXECUTOR_ENV, "") == "ray"


@dataclass
class TestCluster:
    cluster: Any  # ray.cluster_utils.Cluster
    head_gpus: int
    workers: list[Any] = field(default_factory=list)  # ray._private.node.Node, in order added
    client_port: int | None = None  # the head's Ray Client server, if started

    @property
    def address(self) -> str:
        """The GCS address: what a driver on a node of the cluster connects to."""
        return self.cluster.address

    @property
    def client_address(self) -> str:
        """ray://: what a control plane outside the cluster (e.g. beside KubeRay) connects to."""
        assert self.client_port, "the cluster was started without a Ray Client server"
        return f"ray://{LOOPBACK}:{self.client_port}"

    @property
    def head_id(self) -> str:
        return self.cluster.head_node.node_id

    def worker_ids(self) -> list[str]:
        return [node.node_id for node in self.workers]

    def add_worker(self, gpus: int) -> Any:
        node = self.cluster.add_node(num_gpus=gpus, num_cpus=CPUS_PER_NODE, node_ip_address=LOOPBACK,
                                     object_store_memory=OBJECT_STORE_BYTES)
        self.workers.append(node)
        return node

    def remove_worker(self, node_id: str) -> None:
        """The node dies: its raylet and every process of it are killed, as when a host is lost."""
        node = next(node for node in self.workers if node.node_id == node_id)
        self.cluster.remove_node(node, allow_graceful=False)
        self.workers.remove(node)

    def shutdown(self) -> None:
        self.cluster.shutdown()


def start_cluster(head_gpus: int, worker_gpus: list[int], *, client_server: bool = False) -> TestCluster:
    from ray.cluster_utils import Cluster

    from tests.helpers.net import free_port

    head_args = {"num_gpus": head_gpus, "num_cpus": CPUS_PER_NODE, "node_ip_address": LOOPBACK,
                 "include_dashboard": False, "object_store_memory": OBJECT_STORE_BYTES,
                 "_system_config": HEALTH_CHECK}
    client_port = free_port() if client_server else None
    if client_port:
        head_args["ray_client_server_port"] = client_port
    with pytest.MonkeyPatch.context() as patch:
        for name, value in CLUSTER_ENV.items():
            patch.setenv(name, value)  # the nodes' processes inherit it
        cluster = Cluster(initialize_head=True, head_node_args=head_args)
        test_cluster = TestCluster(cluster, head_gpus, client_port=client_port)
        try:
            for gpus in worker_gpus:
                test_cluster.add_worker(gpus)
            cluster.wait_for_nodes()
        except BaseException:
            cluster.shutdown()
            raise
    return test_cluster


def node_paths(root: Path) -> dict[str, str]:
    """Per-node work and cache folders (several 'nodes' share this host's disk)."""
    return {"ray_node_workdir": str(root / "{node_id}" / "attempts"),
            "ray_node_cache_dir": str(root / "{node_id}" / "base-models")}


def placement_groups(namespace: str) -> list[dict[str, Any]]:
    """This platform's placement groups as Ray reports them (needs a connected driver)."""
    from ray.util import placement_group_table

    return [group for group in placement_group_table().values()
            if (group.get("name") or "").startswith(f"{namespace}:")]


def plane_settings(cluster: TestCluster, storage: Any, root: Path, namespace: str = "tuneforge-test",
                   *, client: bool = False, **overrides: Any) -> dict[str, Any]:
    """Settings of a control plane that runs attempts on `cluster` and keeps its objects in
    the S3 bucket `storage` (tests.helpers.s3.S3Storage): the cluster configuration.
    `client`: connect through Ray Client (ray://), as a control plane outside the cluster does."""
    return {
        "executor": "ray", "ray_address": cluster.client_address if client else cluster.address,
        "ray_namespace": namespace,
        "storage_url": storage.url, "s3_endpoint_url": storage.endpoint_url, "s3_region": storage.region,
        "s3_access_key_id": storage.key, "s3_secret_access_key": storage.secret,
        "retry_backoff_s": 1.0, **node_paths(root), **overrides,
    }
