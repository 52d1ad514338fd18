"""The deployment files agree with the code and with each other.

No Docker engine or Kubernetes runs here, so the images are not built and the
manifests not applied; what can be checked is that they parse, that every
TUNEFORGE_* variable they set is a setting tuneforge has, and that the numbers
and names that must match across files do.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

from tuneforge.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def documents(name: str) -> list[dict]:
    return [doc for doc in yaml.safe_load_all((DEPLOY / "kubernetes" / name).read_text()) if doc]


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [doc for doc in docs if doc["kind"] == kind]


@pytest.fixture(scope="module")
def raycluster() -> dict:
    [cluster] = by_kind(documents("raycluster.yaml"), "RayCluster")
    return cluster


@pytest.fixture(scope="module")
def control_plane_env() -> dict[str, object]:
    [deployment] = by_kind(documents("control-plane.yaml"), "Deployment")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in container["env"]}


def dockerfile_args(name: str) -> dict[str, str]:
    text = (DEPLOY / "docker" / name).read_text()
    return dict(re.findall(r"^ARG (\w+)=(\S+)", text, re.MULTILINE))


def test_every_tuneforge_variable_is_a_setting(control_plane_env):
    fields = {f"TUNEFORGE_{name.upper()}" for name in Settings.model_fields}
    named = set(control_plane_env)
    for dockerfile in (DEPLOY / "docker").glob("*.Dockerfile"):
        named |= set(re.findall(r"\b(TUNEFORGE_[A-Z0-9_]+)=", dockerfile.read_text()))
    tuneforge_names = {name for name in named if name.startswith("TUNEFORGE_")}
    assert tuneforge_names and tuneforge_names <= fields, sorted(tuneforge_names - fields)
    # and each value is one the settings accept
    values = {name[len("TUNEFORGE_"):].lower(): value for name, value in control_plane_env.items()
              if name.startswith("TUNEFORGE_") and isinstance(value, str)}
    settings = Settings(**values)
    assert settings.executor == "ray" and settings.resolved_storage_url.startswith("s3://")


def test_the_control_plane_reaches_the_head_through_ray_client(raycluster, control_plane_env):
    address = str(control_plane_env["TUNEFORGE_RAY_ADDRESS"])
    match = re.fullmatch(r"ray://([\w.-]+):(\d+)", address)
    assert match, address
    assert match.group(1) == f"{raycluster['metadata']['name']}-head-svc"  # KubeRay's name for the head Service
    [head] = raycluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"]
    assert int(match.group(2)) in {port["containerPort"] for port in head["ports"]}
    assert raycluster["spec"]["headGroupSpec"]["rayStartParams"]["num-gpus"] == "0"  # no trainer on the head


def test_node_sizes_agree_with_the_settings(raycluster, control_plane_env):
    [workers] = raycluster["spec"]["workerGroupSpecs"]
    gpus = int(workers["rayStartParams"]["num-gpus"])
    [container] = workers["template"]["spec"]["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == gpus
    assert int(str(control_plane_env["TUNEFORGE_GPUS_PER_NODE"])) == gpus
    cpus_per_gpu = float(str(control_plane_env["TUNEFORGE_RAY_CPUS_PER_GPU"]))
    assert cpus_per_gpu * gpus <= int(workers["rayStartParams"]["num-cpus"])
    # the base-model cache (default ~/.cache/tuneforge/base-models, home /home/ray) is on the node-local volume
    cache = Settings().ray_node_cache_dir.replace("~", "/home/ray")
    mounts = {mount["name"]: mount["mountPath"] for mount in container["volumeMounts"]}
    assert cache.startswith(mounts["model-cache"] + "/")


def test_ray_versions_match_across_images_and_cluster(raycluster):
    version = raycluster["spec"]["rayVersion"]
    assert dockerfile_args("trainer.Dockerfile")["RAY_VERSION"] == version
    assert dockerfile_args("control-plane.Dockerfile")["RAY_VERSION"] == version
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["ray"]
    minimum = re.search(r">=([\d.]+)", extra[0]).group(1)
    assert tuple(map(int, version.split("."))) >= tuple(map(int, minimum.split(".")))


def test_kueue_quota_covers_the_whole_ray_cluster(raycluster):
    docs = documents("kueue.yaml")
    [local_queue] = by_kind(docs, "LocalQueue")
    [cluster_queue] = by_kind(docs, "ClusterQueue")
    assert raycluster["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == local_queue["metadata"]["name"]
    assert local_queue["spec"]["clusterQueue"] == cluster_queue["metadata"]["name"]
    flavors = {flavor["metadata"]["name"] for flavor in by_kind(docs, "ResourceFlavor")}
    quota = {"cpu": 0.0, "nvidia.com/gpu": 0.0}
    for group in cluster_queue["spec"]["resourceGroups"]:
        for flavor in group["flavors"]:
            assert flavor["name"] in flavors
            for resource in flavor["resources"]:
                if resource["name"] in quota:
                    quota[resource["name"]] += float(resource["nominalQuota"])
    [head] = raycluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"]
    [workers] = raycluster["spec"]["workerGroupSpecs"]
    [worker] = workers["template"]["spec"]["containers"]
    need_cpu = float(head["resources"]["requests"]["cpu"]) + \
        workers["replicas"] * float(worker["resources"]["requests"]["cpu"])
    need_gpu = workers["replicas"] * worker["resources"]["requests"]["nvidia.com/gpu"]
    assert quota["cpu"] >= need_cpu and quota["nvidia.com/gpu"] == need_gpu


def test_dockerfiles_copy_what_exists_and_run_a_real_command():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    for dockerfile in (DEPLOY / "docker").glob("*.Dockerfile"):
        text = dockerfile.read_text()
        for line in re.findall(r"^COPY (?:--\S+ )*(.+)$", text, re.MULTILINE):
            *sources, _target = line.split()
            for source in sources:
                assert (ROOT / source).exists(), f"{dockerfile.name}: COPY {source}"
        entry = re.search(r'^ENTRYPOINT \["(\w+)", "(\w+)"\]', text, re.MULTILINE)
        if entry:
            assert entry.group(1) in scripts
            from typer.main import get_command

            from tuneforge.cli.main import app

            assert entry.group(2) in get_command(app).commands
