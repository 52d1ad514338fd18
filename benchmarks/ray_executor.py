"""The Ray executor's costs and its node-loss recovery, each against a baseline in
the same run.

A. Launch path — from `POST /v1/fine_tuning/jobs` to the job's `running`
   status (admitted, placement group ready, actor started, trainer process
   spawned), to the trainer's first event (`attempt 1 started`: imports done,
   base model loaded) and to its first metrics event; then cancel, and the time
   until the executor has released the attempt. Baseline: the local executor
   (a subprocess on this host) with the same database, object store and job.
   The Ray cluster is one node of this host with 1 logical GPU; the object
   store is a local folder every "node" shares (TUNEFORGE_RAY_SHARED_STORAGE),
   so the difference is the executor's own.

B. Node loss — a 1-GPU job on a cluster of a head without GPUs and two worker
   nodes with 1 logical GPU each; once it has a checkpoint, its node is
   removed (raylet and every process of it killed). Timed from the removal: the
   attempt recorded `lost`, the next attempt `running` on the other node, its
   `resumed from the checkpoint` event, its first metrics. Baseline: the same
   with the executor's death detection turned off (its `lost` answer read as
   `unknown`), so the scheduler notices only when the heartbeat lease
   (TUNEFORGE_LEASE_TIMEOUT_S) runs out, as with an executor that cannot tell.

Times are observed by this process polling the database every POLL_S, the
control plane running in-process on SQLite with a 0.2 s scheduler tick and 1 s
heartbeats.

    python benchmarks/ray_executor.py [--jobs 5] [--lease-s 60]
"""

from __future__ import annotations

import argparse
import os
import platform as host
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # Ray stays on 127.0.0.1

import openai  # noqa: E402

from tuneforge.db.repos import attempts as attempt_repo  # noqa: E402
from tuneforge.demo.dataset import DEMO_HYPERPARAMETERS, DEMO_LORA, write_demo_files  # noqa: E402
from tuneforge.demo.tiny_model import build_tiny_model  # noqa: E402
from tuneforge.executors.protocol import PollResult  # noqa: E402
from tuneforge.server import ControlPlane  # noqa: E402
from tuneforge.services.serving import base_models as base_model_service  # noqa: E402
from tuneforge.services.tenancy import tenants as tenant_service  # noqa: E402
from tuneforge.settings import Settings  # noqa: E402

POLL_S = 0.02
LOOPBACK = "127.0.0.1"
TIMEOUT_S = 600.0


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


def start_cluster(head_gpus: int, workers: list[int]) -> tuple[Any, list[Any]]:
    from ray.cluster_utils import Cluster

    args = {"num_cpus": 8, "node_ip_address": LOOPBACK, "object_store_memory": 100 * 1024 * 1024}
    cluster = Cluster(initialize_head=True, head_node_args={**args, "num_gpus": head_gpus, "include_dashboard": False})
    nodes = [cluster.add_node(num_gpus=gpus, **args) for gpus in workers]
    cluster.wait_for_nodes()
    return cluster, nodes


@dataclass
class World:
    plane: ControlPlane
    sdk: openai.OpenAI
    training_id: str

    def attempts(self, job_id: str) -> list[Any]:
        with self.plane.platform.db.session() as session:
            return [(a.number, a.status, dict(a.placement or {}), dict(a.handle or {}))
                    for a in attempt_repo.for_job(session, job_id)]

    def close(self) -> None:
        if self.plane.executor is not None:
            self.plane.executor.reap(set())
        self.plane.close()


def start_world(root: Path, model_dir: Path, **overrides: Any) -> World:
    settings = Settings(home=root / "home", database_url=f"sqlite:///{root}/tuneforge.db", port=free_port(),
                        heartbeat_interval_s=1.0, scheduler_tick_s=0.2, eval_by_default=False,
                        retry_backoff_s=1.0, **overrides)
    plane = ControlPlane(settings).start_in_background()
    with plane.platform.db.session() as session:
        _tenant, key = tenant_service.create_tenant(session, "bench")
        base_model_service.add_base_model(session, plane.platform.store, "tiny", str(model_dir), root / "hub")
    sdk = openai.OpenAI(base_url=f"{plane.url}/v1", api_key=key, max_retries=2)
    files = write_demo_files(root / "data")
    training = sdk.files.create(file=files.training_path.open("rb"), purpose="fine-tune")
    return World(plane, sdk, training.id)


def create(world: World, hyperparameters: dict, checkpoint_every: int = 30) -> str:
    job = world.sdk.fine_tuning.jobs.create(
        model="tiny", training_file=world.training_id, seed=0,
        method={"type": "supervised", "supervised": {"hyperparameters": hyperparameters}},
        extra_body={"training_type": {"type": "lora", **DEMO_LORA}, "resources": {"gpus": 1},
                    "checkpointing": {"every_steps": checkpoint_every, "keep_last": 20}})
    return job.id


def wait(condition: Callable[[], Any], what: str, timeout_s: float = TIMEOUT_S) -> float:
    """Seconds until `condition` holds (polled every POLL_S)."""
    start = time.perf_counter()
    while time.perf_counter() - start < timeout_s:
        if condition():
            return time.perf_counter() - start
        time.sleep(POLL_S)
    raise TimeoutError(f"{what} did not happen within {timeout_s:.0f} s")


def events(world: World, job_id: str) -> list[Any]:
    return list(world.sdk.fine_tuning.jobs.list_events(job_id, limit=100))


def has_event(world: World, job_id: str, test: Callable[[Any], bool]) -> bool:
    return any(test(event) for event in events(world, job_id))


# ---- A. launch path -------------------------------------------------------------


def launch_once(world: World) -> dict[str, float]:
    start = time.perf_counter()
    job_id = create(world, {**DEMO_HYPERPARAMETERS, "n_epochs": 50})
    since = lambda: time.perf_counter() - start  # noqa: E731
    wait(lambda: world.sdk.fine_tuning.jobs.retrieve(job_id).status == "running", "running")
    running = since()
    wait(lambda: has_event(world, job_id, lambda e: e.message.startswith("attempt 1 started")),
         "the trainer's first event")
    started = since()
    wait(lambda: has_event(world, job_id, lambda e: e.type == "metrics"), "the first metrics")
    metrics = since()
    world.sdk.fine_tuning.jobs.cancel(job_id)
    released = wait(lambda: "released_at" in world.attempts(job_id)[0][3], "the release", 120)
    return {"running": running, "started": started, "first metrics": metrics, "cancel to released": released}


def part_a(root: Path, model_dir: Path, jobs: int) -> dict[str, dict[str, list[float]]]:
    results: dict[str, dict[str, list[float]]] = {}
    for name in ("local executor", "ray executor"):
        cluster = None
        settings: dict[str, Any] = {"executor": "local", "local_gpus": 1}
        if name == "ray executor":
            cluster, _workers = start_cluster(head_gpus=1, workers=[])
            settings = {"executor": "ray", "ray_address": cluster.address, "ray_shared_storage": True,
                        "ray_node_workdir": str(root / "ray-nodes" / "{node_id}" / "attempts"),
                        "ray_node_cache_dir": str(root / "ray-nodes" / "{node_id}" / "cache")}
        world = start_world(root / name.replace(" ", "-"), model_dir, **settings)
        try:
            runs = [launch_once(world) for _ in range(jobs)]
        finally:
            world.close()
            if cluster is not None:
                cluster.shutdown()
        results[name] = {key: [run[key] for run in runs] for key in runs[0]}
    return results


# ---- B. node loss ---------------------------------------------------------------


def node_loss_once(root: Path, model_dir: Path, detect: bool, lease_s: float) -> dict[str, float]:
    cluster, workers = start_cluster(head_gpus=0, workers=[1, 1])
    world = start_world(root, model_dir, executor="ray", ray_address=cluster.address, ray_shared_storage=True,
                        lease_timeout_s=lease_s,
                        ray_node_workdir=str(root / "nodes" / "{node_id}" / "attempts"),
                        ray_node_cache_dir=str(root / "nodes" / "{node_id}" / "cache"))
    try:
        executor = world.plane.executor
        if not detect:  # an executor that cannot tell a dead node from a slow one
            poll = executor.poll
            executor.poll = lambda handle: (lambda r: PollResult("unknown", detail=r.detail)
                                            if r.state == "lost" else r)(poll(handle))
        job_id = create(world, dict(DEMO_HYPERPARAMETERS), checkpoint_every=10)
        wait(lambda: world.sdk.fine_tuning.jobs.checkpoints.list(job_id).data, "a first checkpoint", 300)
        node_id = world.attempts(job_id)[0][2]["node"]
        node = next(n for n in workers if n.node_id == node_id)
        cluster.remove_node(node, allow_graceful=False)
        lost = wait(lambda: world.attempts(job_id)[0][1] == "lost", "the attempt lost")
        running = wait(lambda: len(world.attempts(job_id)) > 1 and world.attempts(job_id)[1][1] in
                       ("starting", "running"), "the next attempt") + lost
        resumed = wait(lambda: has_event(world, job_id, lambda e: e.message.startswith("resumed from")),
                       "the resume") + running
        metrics_before = sum(1 for e in events(world, job_id) if e.type == "metrics")
        first_metrics = wait(lambda: sum(1 for e in events(world, job_id) if e.type == "metrics") > metrics_before,
                             "metrics of the next attempt") + resumed
        done = world.sdk.fine_tuning.jobs.retrieve(job_id)
        while done.status not in ("succeeded", "failed", "cancelled"):
            time.sleep(0.5)
            done = world.sdk.fine_tuning.jobs.retrieve(job_id)
        assert done.status == "succeeded", done.error
        [(_, _, first, _), (_, _, second, _)] = world.attempts(job_id)
        assert first["node"] != second["node"]
        return {"attempt lost": lost, "next attempt running": running, "resumed": resumed,
                "first metrics after": first_metrics}
    finally:
        world.close()
        cluster.shutdown()


# ---- report -----------------------------------------------------------------------


def summary(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:7.2f}"
    return f"{statistics.median(values):7.2f} (min {min(values):.2f}, max {max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=5, help="jobs per executor in part A")
    parser.add_argument("--lease-s", type=float, default=60.0, help="heartbeat lease (TUNEFORGE_LEASE_TIMEOUT_S)")
    args = parser.parse_args()
    import ray
    import torch

    print(f"machine: {host.machine()}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
          f"torch {torch.__version__}, Ray {ray.__version__}; load {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory(prefix="tuneforge-ray-bench-") as tmp:
        root = Path(tmp)
        model_dir = build_tiny_model(root / "model", seed=0)

        print(f"\nA. launch path, {args.jobs} jobs each, seconds from submit (median, min, max)")
        results = part_a(root / "a", model_dir, args.jobs)
        names = list(results)
        for key in results[names[0]]:
            print(f"  {key:<20}" + "".join(f"  {name}: {summary(results[name][key])}" for name in names))
        for key in ("running", "started", "first metrics"):
            extra = statistics.median(results["ray executor"][key]) - statistics.median(results["local executor"][key])
            print(f"  ray - local, {key}: {extra:+.2f} s")

        print(f"\nB. node loss, seconds from the node's removal (lease {args.lease_s:.0f} s)")
        detected = node_loss_once(root / "b-detect", model_dir, detect=True, lease_s=args.lease_s)
        leased = node_loss_once(root / "b-lease", model_dir, detect=False, lease_s=args.lease_s)
        for key in detected:
            print(f"  {key:<22} death detected: {detected[key]:7.2f}   lease only: {leased[key]:7.2f}")
        print(f"  resumed sooner by {leased['resumed'] - detected['resumed']:.1f} s "
              f"({leased['resumed'] / detected['resumed']:.1f}x)")


if __name__ == "__main__":
    main()
