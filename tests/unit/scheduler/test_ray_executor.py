"""The Ray executor's decisions that need no cluster: where trainers may find the object
store, the bundles of a placement, the names that tie Ray objects to attempts. The
executor on a real cluster is in tests/integration/test_ray_*.py."""

from __future__ import annotations

import pytest

from tuneforge.executors import make_executor
from tuneforge.executors.protocol import Placement
from tuneforge.executors.ray import StorageUnreachable, attempt_name, bundles_for, check_storage, parse_attempt_name
from tuneforge.executors.ray_host import expand_node_path, warmer_name
from tuneforge.settings import Settings


def test_a_local_object_store_is_refused_unless_every_node_shares_it(tmp_path):
    direct = {"home": tmp_path, "executor": "ray", "trainer_storage": "direct"}
    with pytest.raises(StorageUnreachable, match="TUNEFORGE_STORAGE_URL=s3://"):
        check_storage(Settings(**direct))
    check_storage(Settings(**direct, storage_url="s3://bucket/prefix"))
    check_storage(Settings(**direct, ray_shared_storage=True))
    with pytest.raises(StorageUnreachable):  # refused before any connection to a cluster is tried
        make_executor(Settings(**direct, ray_address="127.0.0.1:1"))


def test_trainers_behind_the_object_proxy_need_no_shared_store(tmp_path):
    check_storage(Settings(home=tmp_path, executor="ray"))  # they reach it through the control plane


def test_an_unknown_executor_names_the_setting_and_the_choices(tmp_path):
    with pytest.raises(ValueError, match=r"TUNEFORGE_EXECUTOR.*local, ray"):
        make_executor(Settings(home=tmp_path, executor="slurm"))


def test_one_bundle_per_node_with_rank_zero_first():
    settings = Settings(ray_cpus_per_gpu=2.0)
    placement = Placement.from_assignment({"node-b": (0, 1), "node-a": (2, 3)})
    nodes, bundles = bundles_for(placement, settings)
    assert nodes == ["node-a", "node-b"] and nodes[0] == placement.node
    assert bundles == [{"GPU": 2.0, "CPU": 4.0}, {"GPU": 2.0, "CPU": 4.0}]
    single = bundles_for(Placement("node-c", [0, 1, 2, 3]), settings)
    assert single == (["node-c"], [{"GPU": 4.0, "CPU": 8.0}])


def test_an_attempt_without_gpus_reserves_a_cpu_and_no_zero_gpu_count():
    # (a job on the shared co-training pool: its trainer host needs a CPU on some node, no GPU)
    assert bundles_for(Placement("n", []), Settings(ray_cpus_per_gpu=2.0)) == (["n"], [{"CPU": 2.0}])
    assert bundles_for(Placement("n", []), Settings(ray_cpus_per_gpu=0.0)) == (["n"], [{"CPU": 1.0}])


def test_a_custom_slot_resource_and_no_cpus():
    settings = Settings(ray_gpu_resource="trainer_slot", ray_cpus_per_gpu=0.0)
    assert bundles_for(Placement("n", [0]), settings) == (["n"], [{"trainer_slot": 1.0}])


def test_attempt_names_round_trip_and_ignore_other_namespaces():
    name = attempt_name("tuneforge", "ftjob-abc", 3)
    assert name == "tuneforge:ftjob-abc:3"
    assert parse_attempt_name("tuneforge", name) == ("ftjob-abc", 3)
    assert parse_attempt_name("other", name) is None
    assert parse_attempt_name("tuneforge", "someone-else") is None
    assert parse_attempt_name("tuneforge", "tuneforge:ftjob-abc:x") is None


def test_node_paths_expand_the_node_id_and_home(monkeypatch):
    monkeypatch.setenv("HOME", "/home/trainer")
    assert expand_node_path("~/.cache/tuneforge/base-models", "n1") == "/home/trainer/.cache/tuneforge/base-models"
    assert expand_node_path("/scratch/{node_id}/cache", "abc123") == "/scratch/abc123/cache"


def test_a_nodes_warm_trainer_is_named_after_the_node_and_the_code_it_would_fork():
    name = warmer_name("node-a", {"pip": ["tuneforge==0.1.0"]})
    assert name.startswith("tuneforge-warm-trainer:node-a:")
    assert warmer_name("node-a", {"pip": ["tuneforge==0.1.0"]}) == name  # the same code: the same actor
    assert warmer_name("node-b", {"pip": ["tuneforge==0.1.0"]}) != name
    assert warmer_name("node-a", {"pip": ["tuneforge==0.2.0"]}) != name  # other code: a warm trainer of its own
    assert warmer_name("node-a", None) == warmer_name("node-a", {})
