"""The deployment files agree with the code and with each other.

No Docker engine or Kubernetes runs here, so the images are not built and the
manifests not applied; what can be checked is that they parse, that every
TUNEFORGE_* variable they set is a setting tuneforge has, and that the numbers
and names that must match across files do.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from urllib.parse import urlsplit

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


def test_every_tuneforge_variable_is_a_setting(control_plane_env, monkeypatch):
    fields = {f"TUNEFORGE_{name.upper()}" for name in Settings.model_fields}
    named = set(control_plane_env)
    for dockerfile in (DEPLOY / "docker").glob("*.Dockerfile"):
        named |= set(re.findall(r"\b(TUNEFORGE_[A-Z0-9_]+)=", dockerfile.read_text()))
    tuneforge_names = {name for name in named if name.startswith("TUNEFORGE_")}
    assert tuneforge_names and tuneforge_names <= fields, sorted(tuneforge_names - fields)
    # and each value is one the settings accept, read from the environment as the pod reads it
    # (JSON values such as TUNEFORGE_VLLM_URLS are decoded there)
    for name, value in control_plane_env.items():
        if name.startswith("TUNEFORGE_") and isinstance(value, str):
            monkeypatch.setenv(name, value)
    settings = Settings()
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


# --- vLLM: deploy/compose/vllm.compose.yaml, deploy/kubernetes/vllm.yaml ----------------------------

VLLM_MAX_LORA_RANKS = {1, 8, 16, 32, 64, 128, 256, 320, 512}   # the values vLLM's --max-lora-rank takes
LARGEST_DEFAULT_RANK = 64   # tuneforge's rank by model size goes up to 64 (docs/methods.md)
VLLM_DEFAULT_PORT = 8000
BASE_MODEL_NAME = re.compile(r"[A-Za-z0-9._-]+")   # what services/base_models.add_base_model accepts


def flag(args: list[str], name: str) -> str | None:
    """The value of `name` in an argument list (`--name value` or `--name=value`), None when absent."""
    for index, arg in enumerate(args):
        if arg == name:
            assert index + 1 < len(args), f"{name} has no value"
            return args[index + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def vllm_port(args: list[str]) -> int:
    return int(flag(args, "--port") or VLLM_DEFAULT_PORT)


def assert_vllm_serves_loras_at_run_time(args: list[str], env: dict[str, object]) -> None:
    """The flags and environment tuneforge's hand-off needs from a vLLM server."""
    assert "--enable-lora" in args
    assert env.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING") == "True"   # else no /v1/load_lora_adapter
    rank = int(flag(args, "--max-lora-rank") or 16)
    assert rank in VLLM_MAX_LORA_RANKS and rank >= LARGEST_DEFAULT_RANK, rank
    max_loras = int(flag(args, "--max-loras") or 1)
    assert int(flag(args, "--max-cpu-loras") or max_loras) >= max_loras   # vLLM refuses fewer
    # runtime LoRA updating is refused with several API server processes
    assert int(flag(args, "--api-server-count") or 1) == 1
    assert int(flag(args, "--data-parallel-size") or 1) == 1
    assert flag(args, "--api-key"), "vLLM without a key would load adapters for anyone who asks"
    assert flag(args, "--model")
    served = flag(args, "--served-model-name")
    assert served and BASE_MODEL_NAME.fullmatch(served) and not served.startswith("ft:"), \
        f"--served-model-name {served!r} cannot be a tuneforge base model's name"


def vllm_urls(value: object) -> dict[str, list[str]]:
    urls = json.loads(str(value))
    assert isinstance(urls, dict) and urls
    return {base: [servers] if isinstance(servers, str) else servers for base, servers in urls.items()}


def pinned_tag(image: str) -> str:
    name, _, tag = image.rpartition(":")
    assert name == "vllm/vllm-openai" and re.fullmatch(r"v\d+\.\d+\.\d+", tag), image
    return tag


def control_plane_uid() -> int:
    return int(re.search(r"--uid (\d+)", (DEPLOY / "docker" / "control-plane.Dockerfile").read_text()).group(1))


# Kubernetes

@pytest.fixture(scope="module")
def vllm_manifest() -> list[dict]:
    return documents("vllm.yaml")


@pytest.fixture(scope="module")
def vllm_deployment(vllm_manifest) -> dict:
    [deployment] = by_kind(vllm_manifest, "Deployment")
    return deployment


@pytest.fixture(scope="module")
def vllm_container(vllm_deployment) -> dict:
    [container] = vllm_deployment["spec"]["template"]["spec"]["containers"]
    return container


@pytest.fixture(scope="module")
def control_plane_pod() -> dict:
    [deployment] = by_kind(documents("control-plane.yaml"), "Deployment")
    return deployment["spec"]["template"]


def container_args(container: dict) -> list[str]:
    return [str(arg) for arg in container.get("command", []) + container.get("args", [])]


def container_env(container: dict) -> dict[str, object]:
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in container.get("env", [])}


def named_port(container: dict, port: int | str) -> int:
    """A probe's or Service's port (a number or a container port's name) as a number."""
    if isinstance(port, int):
        return port
    [number] = [item["containerPort"] for item in container["ports"] if item.get("name") == port]
    return number


def claim_mount(pod: dict, claim: str) -> dict:
    """The mount of the volume that is PersistentVolumeClaim `claim` in a pod template's first container."""
    [volume] = [volume["name"] for volume in pod["spec"]["volumes"]
                if volume.get("persistentVolumeClaim", {}).get("claimName") == claim]
    [mount] = [mount for mount in pod["spec"]["containers"][0]["volumeMounts"] if mount["name"] == volume]
    return mount


def test_vllm_serves_the_base_model_the_control_plane_sends_it(vllm_manifest, vllm_container, control_plane_env):
    args = container_args(vllm_container)
    urls = vllm_urls(control_plane_env["TUNEFORGE_VLLM_URLS"])
    served = flag(args, "--served-model-name")
    assert served in urls, (served, sorted(urls))
    [service] = by_kind(vllm_manifest, "Service")
    labels = vllm_manifest[0]["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    for url in urls[served]:
        parts = urlsplit(url)
        assert parts.scheme == "http" and parts.path in ("", "/"), url
        host = parts.hostname or ""
        assert host == service["metadata"]["name"] or host.startswith(service["metadata"]["name"] + "."), url
        [port] = [port for port in service["spec"]["ports"] if port["port"] == parts.port]
        assert named_port(vllm_container, port["targetPort"]) == vllm_port(args)


def test_vllm_loads_lora_adapters_at_run_time_on_one_gpu(vllm_deployment, vllm_container):
    assert_vllm_serves_loras_at_run_time(container_args(vllm_container), container_env(vllm_container))
    pinned_tag(vllm_container["image"])
    assert vllm_container["resources"]["limits"]["nvidia.com/gpu"] == 1
    probe = vllm_container["readinessProbe"]["httpGet"]
    assert probe["path"] == "/health" and named_port(vllm_container, probe["port"]) == \
        vllm_port(container_args(vllm_container))
    # tuneforge loads an adapter into each URL it has: a Service over several pods would load it into one
    assert vllm_deployment["spec"]["replicas"] == 1
    assert vllm_deployment["spec"]["strategy"]["type"] == "Recreate"


def test_the_adapter_claim_is_written_by_the_control_plane_and_read_by_vllm(
        vllm_manifest, vllm_deployment, control_plane_pod, control_plane_env):
    [claim] = by_kind(vllm_manifest, "PersistentVolumeClaim")
    name = claim["metadata"]["name"]
    assert name == "tuneforge-vllm-adapters"
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]   # every replica and vLLM pod, on any node
    in_vllm = claim_mount(vllm_deployment["spec"]["template"], name)
    assert in_vllm["mountPath"] == control_plane_env["TUNEFORGE_VLLM_ADAPTER_DIR_ON_SERVER"]
    assert in_vllm["readOnly"] is True
    in_control_plane = claim_mount(control_plane_pod, name)
    assert in_control_plane["mountPath"] == control_plane_env["TUNEFORGE_VLLM_ADAPTER_DIR"]
    assert not in_control_plane.get("readOnly")
    # the image's user is not root: the claim's root must be made writable for it
    assert control_plane_pod["spec"]["securityContext"]["fsGroup"] == control_plane_uid()


def test_the_vllm_api_key_is_one_secret_on_both_sides(vllm_container, control_plane_env):
    reference = {"secretKeyRef": {"name": "tuneforge", "key": "vllm-api-key"}}
    env = container_env(vllm_container)
    [variable] = re.fullmatch(r"\$\((\w+)\)", flag(container_args(vllm_container), "--api-key")).groups()
    assert env[variable] == reference
    assert control_plane_env["TUNEFORGE_VLLM_API_KEY"] == reference
    # and the instructions that create the Secret give that key
    assert "--from-literal=vllm-api-key=" in (DEPLOY / "kubernetes" / "control-plane.yaml").read_text()


def test_vllm_runs_on_the_ray_clusters_gpu_pool(vllm_deployment, raycluster):
    pod = vllm_deployment["spec"]["template"]["spec"]
    gpu_flavors = [flavor for flavor in by_kind(documents("kueue.yaml"), "ResourceFlavor")
                   if flavor.get("spec", {}).get("nodeLabels")]
    [flavor] = gpu_flavors
    assert pod["nodeSelector"] == flavor["spec"]["nodeLabels"]
    [workers] = raycluster["spec"]["workerGroupSpecs"]
    for toleration in workers["template"]["spec"]["tolerations"]:
        assert toleration in pod["tolerations"]


def test_only_the_control_plane_reaches_vllm(vllm_manifest, vllm_container, control_plane_pod):
    [policy] = by_kind(vllm_manifest, "NetworkPolicy")
    labels = vllm_manifest[0]["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    [rule] = policy["spec"]["ingress"]
    [source] = rule["from"]
    assert source["podSelector"]["matchLabels"].items() <= control_plane_pod["metadata"]["labels"].items()
    assert [port["port"] for port in rule["ports"]] == [vllm_port(container_args(vllm_container))]


# Docker Compose

@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((DEPLOY / "compose" / "vllm.compose.yaml").read_text())


def compose_env(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {name: str(value) for name, value in env.items()}


def compose_args(service: dict) -> list[str]:
    command = service.get("command", [])
    return shlex.split(command) if isinstance(command, str) else [str(arg) for arg in command]


def compose_mounts(service: dict) -> dict[str, tuple[str, bool]]:
    """Mount path -> (volume or host path, read-only)."""
    mounts = {}
    for volume in service.get("volumes", []):
        if isinstance(volume, str):
            source, target, *mode = volume.split(":")
            mounts[target] = (source, "ro" in (mode[0].split(",") if mode else []))
        else:
            mounts[volume["target"]] = (volume["source"], bool(volume.get("read_only")))
    return mounts


def compose_variable(value: str) -> str:
    """The one variable a value is read from (`${NAME}`, `${NAME:?message}`, ...)."""
    match = re.fullmatch(r"\$\{(\w+)(?:[:?-][^}]*)?\}", value)
    assert match, f"{value!r} should come from the environment, not the file"
    return match.group(1)


def interpolated(value: str) -> str:
    """A compose value with every `${NAME...}` replaced by a stand-in, as `docker compose` would."""
    return re.sub(r"\$\{(\w+)[^}]*\}", lambda match: f"{match.group(1).lower()}-value", value)


def test_compose_tuneforge_variables_are_settings_it_accepts(compose, monkeypatch):
    fields = {f"TUNEFORGE_{name.upper()}" for name in Settings.model_fields}
    named = {name for service in compose["services"].values() for name in compose_env(service)
             if name.startswith("TUNEFORGE_")}
    assert named and named <= fields, sorted(named - fields)
    env = compose_env(compose["services"]["tuneforge"])
    for name, value in env.items():
        monkeypatch.setenv(name, interpolated(value))
    settings = Settings()
    assert settings.executor == "local"
    # the object store and the database are the compose file's own
    mounts = compose_mounts(compose["services"]["tuneforge"])
    assert any(settings.resolved_storage_url.startswith(path + "/") and source in compose["volumes"]
               for path, (source, _) in mounts.items())
    database = urlsplit(settings.resolved_database_url)
    assert database.hostname in compose["services"] and database.hostname == "postgres"
    assert compose["services"]["tuneforge"]["depends_on"]["postgres"]["condition"] == "service_healthy"


def test_compose_vllm_serves_the_base_model_tuneforge_sends_it(compose):
    vllm = compose["services"]["vllm"]
    args = compose_args(vllm)
    assert_vllm_serves_loras_at_run_time(args, compose_env(vllm))
    urls = vllm_urls(compose_env(compose["services"]["tuneforge"])["TUNEFORGE_VLLM_URLS"])
    served = flag(args, "--served-model-name")
    assert served in urls, (served, sorted(urls))
    for url in urls[served]:
        parts = urlsplit(url)
        assert (parts.scheme, parts.hostname, parts.port) == ("http", "vllm", vllm_port(args)), url
    assert f"127.0.0.1:{vllm_port(args)}/health" in " ".join(vllm["healthcheck"]["test"])
    [device] = vllm["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"] and device["count"] >= 1


def test_compose_shares_the_adapter_volume(compose):
    tuneforge, vllm = compose["services"]["tuneforge"], compose["services"]["vllm"]
    env = compose_env(tuneforge)
    volume, read_only = compose_mounts(tuneforge)[env["TUNEFORGE_VLLM_ADAPTER_DIR"]]
    assert volume in compose["volumes"] and not read_only
    assert compose_mounts(vllm)[env["TUNEFORGE_VLLM_ADAPTER_DIR_ON_SERVER"]] == (volume, True)
    # a new volume's root is root's: a service hands it to the image's user before tuneforge starts
    owners = [name for name, service in compose["services"].items()
              if volume in {source for source, _ in compose_mounts(service).values()}
              and compose_args(service)[:1] == ["chown"]]
    [owner] = owners
    chown = compose_args(compose["services"][owner])
    assert chown[1].split(":")[0] == str(control_plane_uid())
    assert compose_mounts(compose["services"][owner])[chown[2]] == (volume, False)
    assert tuneforge["depends_on"][owner]["condition"] == "service_completed_successfully"


def test_compose_vllm_key_is_one_variable_on_both_sides(compose):
    args = compose_args(compose["services"]["vllm"])
    env = compose_env(compose["services"]["tuneforge"])
    assert compose_variable(flag(args, "--api-key")) == compose_variable(env["TUNEFORGE_VLLM_API_KEY"])


def test_compose_builds_the_control_plane_image_and_pins_vllm_as_kubernetes_does(compose, vllm_container):
    build = compose["services"]["tuneforge"]["build"]
    context = (DEPLOY / "compose" / build["context"]).resolve()
    assert context == ROOT and (context / build["dockerfile"]) == DEPLOY / "docker" / "control-plane.Dockerfile"
    assert pinned_tag(compose["services"]["vllm"]["image"]) == pinned_tag(vllm_container["image"])


def test_the_pooled_ray_cluster_names_the_pools_its_settings_price(monkeypatch):
    """deploy/kubernetes/raycluster-pools.yaml: every worker group is a pool the ConfigMap prices,
    named through the custom resource the Ray executor reads; spot pods go to spot nodes and have
    the time to checkpoint."""
    from tuneforge.executors.ray import POOL_RESOURCE_PREFIX, node_pool

    docs = documents("raycluster-pools.yaml")
    [config] = by_kind(docs, "ConfigMap")
    for name, value in config["data"].items():
        monkeypatch.setenv(name, value)
    settings = Settings()
    pools = settings.capacity_pools
    assert {p.kind for p in pools.values()} == {"spot", "on_demand"}
    assert all(not p.nodes for p in pools.values())  # the nodes say their pool
    [cluster] = by_kind(docs, "RayCluster")
    seen = set()
    for group in cluster["spec"]["workerGroupSpecs"]:
        resources = json.loads(json.loads(group["rayStartParams"]["resources"]))
        pool = node_pool({"Resources": {**resources, "GPU": 8.0}})
        assert pool in pools and f"{POOL_RESOURCE_PREFIX}{pool}" in resources, group["groupName"]
        seen.add(pool)
        spec = group["template"]["spec"]
        if pools[pool].kind == "spot":
            assert spec["nodeSelector"] and any(t["key"] == "cloud.google.com/gke-spot" for t in spec["tolerations"])
            assert spec["terminationGracePeriodSeconds"] >= settings.preempt_grace_s
    assert seen == set(pools)
