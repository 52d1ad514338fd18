"""Ray executor: each attempt runs on an existing Ray cluster, in a placement group
of its own.

The scheduler has already chosen the nodes and GPU counts (`Placement`); this
module only carries that out:

- `capacity()` reads the cluster's live nodes, their GPUs (`ray_gpu_resource`)
  and what Ray says is still free on each (work outside tuneforge included).
  The control plane connects as a driver on a node (`host:6379`) or from
  outside the cluster through Ray Client (`ray://head:10001`); both work.
- `launch()` reserves one bundle per node — `{GPU: n, CPU: n * cpus_per_gpu}`
  pinned to that node by its `ray.io/node-id` label — with STRICT_PACK for a
  one-node job and STRICT_SPREAD across nodes, so the attempt gets all its
  GPUs or none. It then starts one `TrainerHost` actor per bundle; the actors
  start the trainer processes, one per GPU, rank 0 on the first node, all
  joined in one data-parallel process group at rank 0's address.
- `poll()` asks the actors: rank 0's exit code is the attempt's; an actor that
  died with its node makes the attempt `lost` at once (the scheduler requeues
  it; Ray never retries anything by itself: `max_restarts=0`).
- `signal()` forwards preempt (SIGTERM, then SIGKILL after the grace period)
  and cancel (SIGKILL) to every rank.
- `release()` kills the actors and removes the placement group once the
  attempt's end is recorded; `reap()` does the same for attempts a crashed
  control plane never released.

Actors and placement groups are detached and named after the attempt
(`{namespace}:{job_id}:{attempt}`), so a restarted control plane finds the
attempts it launched before and they keep training while it is away.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Literal

from tuneforge.domain.spec import JobSpec
from tuneforge.executors.protocol import Capacity, NodeCapacity, Placement, PollResult
from tuneforge.executors.ray_host import WARM_WAIT_S, TrainerHost, free_resources_per_node
from tuneforge.security.redact import redact_url
from tuneforge.settings import Settings

log = logging.getLogger(__name__)

NODE_ID_LABEL = "ray.io/node-id"
CALL_TIMEOUT_S = 10.0  # a question to an actor; no answer in time: "unknown", the lease decides


class StorageUnreachable(ValueError):
    """The object store is a local folder that trainers on other nodes cannot read."""


def check_storage(settings: Settings) -> None:
    if settings.trainer_storage == "proxy":  # trainers reach the store through the control plane
        return
    url = settings.resolved_storage_url
    if "://" in url and not url.startswith("file://"):  # s3:// or another remote store
        return
    if not settings.ray_shared_storage:
        raise StorageUnreachable(
            f"TUNEFORGE_EXECUTOR=ray runs trainers on other nodes, which cannot read the local object store "
            f"{redact_url(url)}: set TUNEFORGE_STORAGE_URL=s3://bucket/prefix (and TUNEFORGE_S3_*), or "
            "TUNEFORGE_RAY_SHARED_STORAGE=true if every node mounts that folder at the same path")


def attempt_name(namespace: str, job_id: str, attempt: int) -> str:
    return f"{namespace}:{job_id}:{int(attempt)}"


def parse_attempt_name(namespace: str, name: str) -> tuple[str, int] | None:
    """(job id, attempt) of one of this platform's placement groups, else None."""
    parts = name.split(":")
    if len(parts) != 3 or parts[0] != namespace or not parts[2].isdigit():
        return None
    return parts[1], int(parts[2])


def bundles_for(placement: Placement, settings: Settings) -> tuple[list[str], list[dict[str, float]]]:
    """Nodes (the placement's first node first: rank 0 runs there) and one bundle each."""
    spans = placement.spans or {placement.node: placement.gpu_ids}
    order = [placement.node] + sorted(name for name in spans if name != placement.node)
    bundles = []
    for name in order:
        gpus = len(spans[name])
        # an attempt without GPUs (a job on the shared co-training pool) reserves a CPU, never a zero GPU count
        bundle: dict[str, float] = {settings.ray_gpu_resource: float(gpus)} if gpus else {}
        cpus = settings.ray_cpus_per_gpu * max(gpus, 1)
        if cpus > 0 or not gpus:
            bundle["CPU"] = float(max(cpus, 1.0) if not gpus else cpus)
        bundles.append(bundle)
    return order, bundles


class RayExecutor:
    def __init__(self, settings: Settings) -> None:
        check_storage(settings)
        import ray

        self.settings = settings
        self.namespace = settings.ray_namespace
        self._ray = ray
        self._owns_connection = False
        address = settings.ray_address or os.environ.get("RAY_ADDRESS") or "auto"
        self._client_mode = address.startswith("ray://")
        if not ray.is_initialized():
            options: dict[str, Any] = {"namespace": self.namespace, "log_to_driver": False}
            if not self._client_mode:
                options["configure_logging"] = False  # the control plane's logging stays its own
            _connect(ray, address, options)
            self._owns_connection = True
        self._host_class = ray.remote(TrainerHost)
        self._free_task = ray.remote(num_cpus=0, max_retries=0)(free_resources_per_node)
        self._actors: dict[str, Any] = {}  # actor name -> handle, looked up once

    # ---- the protocol ------------------------------------------------------
    def capacity(self) -> Capacity:
        resource = self.settings.ray_gpu_resource
        free_by_node = self._available_per_node()
        draining = self._draining_nodes()
        nodes = []
        for node in self._ray.nodes():
            total = int(node.get("Resources", {}).get(resource, 0))
            if not node.get("Alive") or total <= 0:
                continue
            node_id = node["NodeID"]
            free = total if free_by_node is None else int(free_by_node.get(node_id, {}).get(resource, 0))
            model, memory_gb, interconnect = node_hardware(node)
            nodes.append(NodeCapacity(node_id, total, max(0, min(total, free)), pool=node_pool(node),
                                      draining=node_id in draining, gpu_model=model, gpu_memory_gb=memory_gb,
                                      interconnect=interconnect))
        return Capacity(nodes=sorted(nodes, key=lambda n: n.name))

    def _draining_nodes(self) -> set[str]:
        """Nodes the cluster is draining (a spot provider's reclaim notice or an autoscaler's
        scale-down reaches Ray as a drain with a deadline). Read from the GCS, which a driver
        inside the cluster reaches; through Ray Client it is not known (empty)."""
        try:
            from ray._private import state as ray_state

            return {str(node_id) for node_id in ray_state.state.get_draining_nodes()}
        except Exception:  # noqa: BLE001 - a private interface, and absent through Ray Client
            return set()

    def launch(self, spec: JobSpec, placement: Placement) -> dict[str, Any]:
        """Reserve the attempt's GPUs, start its actors, then its ranks; on any failure free
        what was taken and raise (the scheduler requeues the job)."""
        if not placement.node and spec.gpus == 0:  # no GPUs (a job on the shared pool): a node with GPUs
            # of the platform's, the fullest one, where its trainer host runs on a CPU
            nodes_now = sorted((node for node in self.capacity().nodes if not node.draining),
                               key=lambda node: (node.free_gpus, node.name))
            if not nodes_now:
                raise RuntimeError(f"{spec.job_id}: the Ray cluster has no node to run the attempt on")
            placement = Placement(nodes_now[0].name, [])
        if not placement.node:
            raise ValueError(f"{spec.job_id}: the Ray executor needs a placement on at least one node")
        name = attempt_name(self.namespace, spec.job_id, spec.attempt)
        nodes, bundles = bundles_for(placement, self.settings)
        ranks_per_node = [max(1, int(bundle.get(self.settings.ray_gpu_resource, 0))) for bundle in bundles]
        handle = {"executor": "ray", "name": name, "nodes": nodes, "ranks": ranks_per_node, "node": nodes[0]}
        try:
            group = self._reserve(name, nodes, bundles)
            hosts = self._start_hosts(name, group, bundles)
            handle["addresses"] = self._start_ranks(spec, hosts, ranks_per_node)
        except BaseException:
            self.release(handle)
            raise
        for index, host in enumerate(hosts):
            self._actors[f"{name}:{index}"] = host
        return handle

    def poll(self, handle: dict[str, Any]) -> PollResult:
        ray = self._ray
        if handle.get("executor") != "ray":  # launched before the platform moved to Ray
            return PollResult("unknown", detail="launched by another executor: its lease decides")
        try:
            hosts = self._hosts(handle)
        except ValueError as exc:
            return PollResult("lost", detail=f"the attempt's trainer actors are gone ({exc})")
        try:
            statuses = ray.get([host.status.remote() for host in hosts], timeout=CALL_TIMEOUT_S)
        except ray.exceptions.ActorDiedError as exc:
            self._forget(handle)
            return PollResult("lost", detail=f"a node of the attempt was lost: {_first_line(exc)}")
        except (ray.exceptions.GetTimeoutError, ray.exceptions.RayError) as exc:
            return PollResult("unknown", detail=f"no answer from the attempt's actors: {_first_line(exc)}")
        rank0 = statuses[0].get(0)
        if rank0 is not None:
            return PollResult("exited", int(rank0))
        return PollResult("running")

    def signal(self, handle: dict[str, Any], action: Literal["preempt", "cancel"]) -> None:
        ray = self._ray
        if handle.get("executor") != "ray":
            return
        try:
            hosts = self._hosts(handle)
        except ValueError:
            return  # nothing left to signal
        calls = [host.signal.remote(action, self.settings.preempt_grace_s) for host in hosts]
        try:
            ray.get(calls, timeout=CALL_TIMEOUT_S)
        except ray.exceptions.RayError as exc:  # a dead node's ranks are beyond signals
            log.warning("signalling %s (%s): %s", handle.get("name"), action, _first_line(exc))

    def log_tail(self, handle: dict[str, Any], max_bytes: int = 4000) -> str:
        if handle.get("executor") != "ray":
            return ""
        try:
            host = self._hosts(handle)[0]
            return str(self._ray.get(host.log_tail.remote(max_bytes), timeout=CALL_TIMEOUT_S))
        except (ValueError, self._ray.exceptions.RayError):
            return ""

    def prepare(self) -> None:
        """Nothing to do: each attempt's trainers start on the nodes Ray picks for it."""

    def release(self, handle: dict[str, Any]) -> None:
        name = handle.get("name")
        if not name or handle.get("executor", "ray") != "ray":
            return
        ray = self._ray
        for index in range(len(handle.get("nodes") or [])):
            actor_name = f"{name}:{index}"
            try:
                host = self._actors.pop(actor_name, None) or ray.get_actor(actor_name, namespace=self.namespace)
            except ValueError:
                continue  # never created, or already gone
            try:
                ray.get(host.stop.remote(), timeout=CALL_TIMEOUT_S)
            except ray.exceptions.RayError:
                pass
            ray.kill(host, no_restart=True)
        self._remove_group(name)

    def reap(self, active: set[tuple[str, int]]) -> list[str]:
        from ray.util import placement_group_table

        freed = []
        for group in placement_group_table().values():
            name = group.get("name") or ""
            key = parse_attempt_name(self.namespace, name)
            if key is None or key in active or group.get("state") == "REMOVED":
                continue
            self.release({"name": name, "nodes": list(group.get("bundles") or {})})
            freed.append(name)
        if freed:
            log.warning("released %d placement group(s) of attempts that had ended: %s", len(freed),
                        ", ".join(freed))
        return freed

    def close(self) -> None:
        self._actors.clear()
        if self._owns_connection and self._ray.is_initialized():
            self._ray.shutdown()
            self._owns_connection = False

    # ---- helpers -------------------------------------------------------------
    def _reserve(self, name: str, nodes: list[str], bundles: list[dict[str, float]]) -> Any:
        """The attempt's placement group, ready: one bundle per node, each pinned to its node."""
        from ray.util.placement_group import placement_group

        ray, timeout_s = self._ray, self.settings.ray_placement_timeout_s
        group = placement_group(bundles, strategy="STRICT_PACK" if len(nodes) == 1 else "STRICT_SPREAD",
                                name=name, lifetime="detached",
                                bundle_label_selector=[{NODE_ID_LABEL: node} for node in nodes])
        try:
            ray.get(group.ready(), timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            gpus = sum(bundle.get(self.settings.ray_gpu_resource, 0.0) for bundle in bundles)
            raise RuntimeError(f"the placement group for {gpus:.0f} GPU(s) on node(s) {', '.join(nodes)} was not "
                               f"ready within {timeout_s:.0f} s (GPUs taken by work outside tuneforge, or a node "
                               "that left)") from None
        return group

    def _start_hosts(self, name: str, group: Any, bundles: list[dict[str, float]]) -> list[Any]:
        """One detached TrainerHost actor in each bundle; Ray never restarts them."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        settings = self.settings
        hosts = []
        for index, bundle in enumerate(bundles):
            gpus = bundle.get(settings.ray_gpu_resource, 0.0)
            options: dict[str, Any] = {
                "name": f"{name}:{index}", "namespace": self.namespace, "lifetime": "detached",
                "max_restarts": 0, "max_task_retries": 0, "num_cpus": bundle.get("CPU", 0.0),
                "scheduling_strategy": PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index),
            }
            if settings.ray_gpu_resource == "GPU":
                options["num_gpus"] = gpus  # Ray sets the actor's CUDA_VISIBLE_DEVICES
            elif gpus:
                options["resources"] = {settings.ray_gpu_resource: gpus}
            if settings.ray_runtime_env:
                options["runtime_env"] = settings.ray_runtime_env
            hosts.append(self._host_class.options(**options).remote(
                name, settings.ray_node_workdir, settings.ray_node_cache_dir))
        return hosts

    def _start_ranks(self, spec: JobSpec, hosts: list[Any], ranks_per_node: list[int]) -> list[str]:
        """Every rank, rank 0 on the first host, all pointed at its address; returns the
        hosts' addresses."""
        ray = self._ray
        timeout_s = max(self.settings.start_timeout_s, CALL_TIMEOUT_S)  # actor start-up, runtime_env included
        where = ray.get([host.where.remote() for host in hosts], timeout=timeout_s)
        master = where[0]
        env = self.attempt_env()
        # each node forks its ranks from its warm trainer, waiting for it at most half the call's time
        warm_wait_s = min(WARM_WAIT_S, timeout_s / 2) if self.settings.trainer_warm_start else None
        world, first, calls = sum(ranks_per_node), 0, []
        for host, count in zip(hosts, ranks_per_node):
            calls.append(host.start.remote(spec.to_json(), env, list(range(first, first + count)), world,
                                           master["address"], master["port"], warm_wait_s))
            first += count
        ray.get(calls, timeout=timeout_s)
        return [w["address"] for w in where]

    def attempt_env(self) -> dict[str, str]:
        """The variables every rank of an attempt is given, beside its node's allow-listed ones
        (ray_host.py): the platform's trainer variables (no store credential unless
        TUNEFORGE_TRAINER_STORAGE=direct). Passed in the call, not in a runtime_env the dashboard
        shows; the operator's runtime_env variables are passed on by name, since a trainer gets no
        other variable of its host."""
        operator_env = (self.settings.ray_runtime_env or {}).get("env_vars") or {}
        return {**operator_env, **self.settings.trainer_env()}

    def _hosts(self, handle: dict[str, Any]) -> list[Any]:
        """The attempt's actors, rank 0's first; ValueError if one of them does not exist."""
        name = handle["name"]
        hosts = []
        for index in range(len(handle.get("nodes") or [])):
            actor_name = f"{name}:{index}"
            host = self._actors.get(actor_name)
            if host is None:
                host = self._ray.get_actor(actor_name, namespace=self.namespace)
                self._actors[actor_name] = host
            hosts.append(host)
        if not hosts:
            raise ValueError(f"the handle of {name} lists no nodes")
        return hosts

    def _forget(self, handle: dict[str, Any]) -> None:
        for index in range(len(handle.get("nodes") or [])):
            self._actors.pop(f"{handle['name']}:{index}", None)

    def _remove_group(self, name: str) -> None:
        from ray.util import get_placement_group, remove_placement_group

        try:
            group = get_placement_group(name)
        except ValueError:
            return
        try:
            remove_placement_group(group)
        except Exception as exc:  # noqa: BLE001 - removing twice, or a GCS hiccup: reap() retries
            log.warning("removing placement group %s: %s", name, exc)

    def _available_per_node(self) -> dict[str, dict[str, float]] | None:
        """Ray's free resources per node (through Ray Client: asked of a task in the cluster);
        None when Ray cannot tell, and the database alone says what is free."""
        try:
            if self._client_mode:
                return self._ray.get(self._free_task.remote(), timeout=CALL_TIMEOUT_S)
            return free_resources_per_node()
        except Exception as exc:  # noqa: BLE001 - a private API of Ray's; without it the database decides
            log.debug("free resources per node unknown: %s", exc)
            return None


def _connect(ray: Any, address: str, options: dict[str, Any], tries: int = 3, backoff_s: float = 2.0) -> None:
    """ray.init, tried again when the connection itself fails (a head that is restarting, a
    Ray Client server whose per-client process did not come up)."""
    for attempt in range(1, tries + 1):
        try:
            ray.init(address=address, **options)
            return
        except (ConnectionError, TimeoutError) as exc:
            if attempt == tries:
                raise ConnectionError(f"cannot connect to the Ray cluster at {redact_url(address)} "
                                      "(TUNEFORGE_RAY_ADDRESS): "
                                      f"{_first_line(exc)}") from exc
            log.warning("connecting to Ray at %s failed (%s); trying again", redact_url(address), _first_line(exc))
            if ray.is_initialized():
                ray.shutdown()
            time.sleep(backoff_s * attempt)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


POOL_LABEL = "tuneforge.io/pool"
POOL_RESOURCE_PREFIX = "tuneforge_pool_"


def node_pool(node: dict[str, Any]) -> str:
    """The capacity pool a Ray node says it is in: its `tuneforge.io/pool` label (`ray start
    --labels`, a KubeRay worker group's rayStartParams), else a custom resource
    `tuneforge_pool_<name>`; "" when it says neither (the settings' node lists decide)."""
    label = (node.get("Labels") or {}).get(POOL_LABEL)
    if label:
        return str(label)
    for resource in node.get("Resources") or {}:
        if resource.startswith(POOL_RESOURCE_PREFIX):
            return resource[len(POOL_RESOURCE_PREFIX):]
    return ""


GPU_MODEL_LABEL = "tuneforge.io/gpu-model"
GPU_MEMORY_LABEL = "tuneforge.io/gpu-memory-gb"
INTERCONNECT_LABEL = "tuneforge.io/interconnect"
GPU_MEMORY_RESOURCE = "tuneforge_gpu_memory_gb"
RAY_ACCELERATOR_LABEL = "ray.io/accelerator-type"
RAY_ACCELERATOR_PREFIX = "accelerator_type:"


def node_hardware(node: dict[str, Any]) -> tuple[str, float, str]:
    """(GPU model, GiB per GPU, interconnect) a Ray node says it has; "" and 0 for what it does not say.

    Model: its `tuneforge.io/gpu-model` label, else Ray's own `ray.io/accelerator-type` label, else
    the `accelerator_type:<X>` resource Ray sets on a node with GPUs (e.g. "A100-80G", "L4").
    Memory: its `tuneforge.io/gpu-memory-gb` label, else a custom resource `tuneforge_gpu_memory_gb`
    whose quantity is the GiB of one GPU (`ray start --resources '{"tuneforge_gpu_memory_gb": 80}'`).
    Interconnect: its `tuneforge.io/interconnect` label (e.g. "nvlink")."""
    labels = node.get("Labels") or {}
    resources = node.get("Resources") or {}
    model = str(labels.get(GPU_MODEL_LABEL) or labels.get(RAY_ACCELERATOR_LABEL) or "")
    if not model:
        model = next((name[len(RAY_ACCELERATOR_PREFIX):] for name in sorted(resources)
                      if name.startswith(RAY_ACCELERATOR_PREFIX)), "")
    memory_gb = 0.0
    for raw in (labels.get(GPU_MEMORY_LABEL), resources.get(GPU_MEMORY_RESOURCE)):
        try:
            memory_gb = float(raw) if raw is not None else 0.0
        except (TypeError, ValueError):
            memory_gb = 0.0  # a label that is not a number says nothing
        if memory_gb > 0:
            break
    return model.strip(), max(0.0, memory_gb), str(labels.get(INTERCONNECT_LABEL) or "").strip()
