"""Settings of where trainers run and how the scheduler shares them: the executor (local or Ray),
the inventory, scheduling and recovery, capacity pools. Part of `tuneforge.settings.Settings`
(read from `TUNEFORGE_*` like the rest)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class CapacityPool(BaseModel):
    """One pool of the inventory (planning/pools.py)."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["spot", "on_demand", "reserved"]
    price_per_gpu_hour: float = Field(ge=0)
    preemptions_per_hour: float = Field(
        0.0, ge=0, description="Spot: reclaims per node-hour, observed or as the provider publishes them.")
    nodes: list[str] = Field(default_factory=list, description="Its nodes by name (the local executor's "
                                                               "local, local-1, ...); Ray nodes may say their "
                                                               "pool themselves (a tuneforge.io/pool label).")


class ClusterSettings(BaseModel):
    executor: str = Field(default="local", description="Executor: 'local' (subprocesses on this host) or 'ray' "
                                                       "(attempts on a Ray cluster, one placement group each).")
    ray_address: str | None = Field(
        default=None, description="Ray cluster to run attempts on: 'host:6379' when this host is a node of the "
                                  "cluster, 'ray://head:10001' (Ray Client) when it is not, or 'auto'; unset: "
                                  "RAY_ADDRESS, else 'auto'.")
    ray_namespace: str = Field(
        default="tuneforge", description="Ray namespace of the trainer actors and placement groups; control planes "
                                         "of different platforms on one cluster need different namespaces.")
    ray_gpu_resource: str = Field(
        default="GPU", description="The Ray resource that counts as one GPU slot (a custom resource such as "
                                   "'trainer_slot' lets a CPU-only cluster run trainers).")
    ray_cpus_per_gpu: float = Field(
        default=1.0, ge=0.0, description="CPUs reserved beside each GPU of an attempt's placement group (data "
                                         "loading, tokenization, the trainer's own threads).")
    ray_placement_timeout_s: float = Field(
        default=60.0, gt=0.0, description="How long a launch waits for its placement group; one that is not ready "
                                          "by then is removed and the job requeued (GPUs taken by work outside "
                                          "tuneforge, or a node that left).")
    ray_node_workdir: str = Field(
        default="/tmp/tuneforge/attempts", description="Folder on each Ray node for attempts' specs and logs; "
                                                       "'{node_id}' in it is replaced by the node's Ray id.")
    ray_node_cache_dir: str = Field(
        default="~/.cache/tuneforge/base-models", description="Folder on each Ray node where base models are cached "
                                                            "by SHA, so a second job on that node downloads "
                                                            "nothing; '{node_id}' is replaced by the node's id.")
    ray_runtime_env: dict | None = Field(
        default=None, description="Ray runtime_env of the trainer actors (JSON), e.g. env_vars such as "
                                  "NCCL_SOCKET_IFNAME, or a container image; unset: the nodes' own Python "
                                  "environment, which must have tuneforge installed.")
    ray_shared_storage: bool = Field(
        default=False, description="With the ray executor, allow a local-folder object store: only right when "
                                   "every node mounts that folder at the same path (otherwise use s3://).")
    local_gpus: int = Field(
        default=1,
        description="Slots of the local executor: GPUs on this host, or logical slots on a CPU-only host.",
    )
    local_nodes: int = Field(
        default=1, description="Logical nodes of the local executor, each with TUNEFORGE_LOCAL_GPUS slots "
                               "(so gang placement across nodes can be exercised on one host).")
    local_gpu_model: str = Field(
        default="", description="Model of this host's GPUs as the local executor reports it (e.g. 'NVIDIA L4'); "
                                "unset: read from NVML, unknown on a host without one (placement then accepts "
                                "any resources.gpu_type here).")
    local_gpu_memory_gb: float = Field(
        default=0.0, ge=0.0, description="Memory of one of this host's GPUs in GiB; 0: read from NVML (the "
                                         "smallest of the first TUNEFORGE_LOCAL_GPUS devices), unknown on a host "
                                         "without one (placement then accepts any resources.gpu_memory_gb).")
    local_interconnect: str = Field(
        default="", description="How this host's GPUs talk, e.g. 'nvlink' or 'pcie' (reported with the "
                                "inventory; not used to place jobs).")
    trainer_warm_start: bool = Field(
        default=True, description="Fork each trainer from a process that has imported torch, transformers and "
                                  "peft once (one per control plane with the local executor, one per node with "
                                  "the Ray executor): it starts in well under a second instead of several; "
                                  "false: every trainer is a fresh interpreter.")
    trainer_isolation: Literal["none", "namespace"] = Field(
        default="none", description="The local executor's trainers: 'none' (default) run as the control plane's "
                                    "user with its files in sight; 'namespace' run each in a mount namespace of its "
                                    "own (bubblewrap) where the platform's home is an empty folder but for the "
                                    "attempt's own folder and the base-model cache: no database, secrets key, log "
                                    "or other attempt's spec and token to read (docs/security.md). Trainers then "
                                    "start cold (no warm start).")
    gpus_per_node: int = Field(default=8, description="GPUs per node assumed when sizing multi-node jobs.")
    gpu_memory_gb: float = Field(default=80.0, description="Memory of one GPU, for default GPU counts.")
    scheduler_tick_s: float = Field(default=0.5, description="Seconds between scheduler ticks.")
    scheduler_aging_s: float = Field(
        default=43200.0, description="Queue aging: waiting this long is worth one tier (no job starves).")
    premium_target_wait_s: float = Field(
        default=300.0,
        description="A premium job that would wait longer preempts lower-tier work (checkpoint, requeue).",
    )
    lease_timeout_s: float = Field(
        default=60.0, description="An attempt whose last heartbeat is older than this is lost."
    )
    heartbeat_interval_s: float = Field(default=5.0, description="Trainer heartbeat period.")
    start_timeout_s: float = Field(
        default=300.0, description="An attempt that has not sent its first heartbeat this long after launch "
                                   "is lost (imports and start-up on a busy host take a while).")
    preempt_grace_s: float = Field(
        default=90.0, description="After a preemption notice (SIGTERM) a trainer has this long to checkpoint "
                                  "and exit before it is killed.")
    max_attempt_failures: int = Field(
        default=3, description="Platform failures (crash, lost host, launch error) after which a job fails.")
    retry_backoff_s: float = Field(
        default=10.0, description="Wait before retrying after the first platform failure; doubles each time.")
    retry_backoff_max_s: float = Field(default=300.0, description="Longest wait between retries.")
    capacity_pools: dict[str, CapacityPool] = Field(
        default_factory=dict,
        description='Capacity pools by name (JSON), e.g. {"spot": {"kind": "spot", "price_per_gpu_hour": 1.2, '
                    '"preemptions_per_hour": 0.05, "nodes": ["local-1"]}, "on-demand": {"kind": "on_demand", '
                    '"price_per_gpu_hour": 4.0, "nodes": ["local"]}}. Jobs start on the cheapest pool that can '
                    'still meet their deadline; each attempt is billed at its pool\'s price. Unset: one pool, '
                    'priced by TUNEFORGE_PRICE_PER_GPU_HOUR (docs/scheduling.md).')
    capacity_by_tier: dict[str, Literal["auto", "spot", "on_demand"]] = Field(
        default_factory=lambda: {"free": "spot", "standard": "auto", "premium": "on_demand"},
        description="A job's resources.capacity when it sets none, by its tenant's tier.")
    spot_max_preemptions: int = Field(
        default=2, ge=0, description="Spot reclaims an auto job may take beyond what its nodes and length make "
                                     "expected there; past them it runs on on-demand (docs/scheduling.md).")
    spot_max_wait_s: float = Field(
        default=1800.0, ge=0, description="An auto job without a deadline that waited this long for spot may take "
                                          "on-demand; one with a deadline may when its slack is below this.")
