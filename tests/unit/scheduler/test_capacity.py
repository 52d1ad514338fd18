"""One answer to "what does the executor offer?" (`Platform.capacity`): the live inventory,
else the local executor's configured slots, else unknown — and what validation and the
queue views make of an unknown one (a standby or API-only control plane of a Ray platform)."""

from __future__ import annotations

import io

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from tests.helpers.platform import add_base_model, add_tenant, chat_lines, make_platform
from tests.unit.api.test_metrics import scrape
from tuneforge.api.app import create_app
from tuneforge.db.tables import Job
from tuneforge.executors.local import local_inventory
from tuneforge.executors.protocol import Capacity, NodeCapacity

ADMIN_KEY = "admin-secret"


def test_the_live_inventory_comes_first_then_local_slots_and_a_ray_platform_without_one_is_unknown(
        tmp_path, database_url):
    local = make_platform(tmp_path / "local", database_url, local_gpus=3, local_nodes=2)
    ray = make_platform(tmp_path / "ray", database_url, executor="ray", local_gpus=3)
    try:
        assert local.capacity() == local_inventory(local.settings)
        assert [(n.name, n.total_gpus) for n in local.capacity().nodes] == [("local", 3), ("local-1", 3)]
        assert ray.capacity() is None  # not the local slots: the cluster is elsewhere
        live = Capacity([NodeCapacity("gpu-a", 8, 6), NodeCapacity("gpu-b", 8, 8)])
        local.inventory = live
        ray.inventory = live  # what a leader's scheduler records each tick
        assert local.capacity() is live and ray.capacity() is live
    finally:
        local.db.dispose()
        ray.db.dispose()


@pytest.fixture
def standby(tmp_path, database_url, tiny_model_dir):
    """The API of a control plane on a Ray platform whose scheduler is not leading: no inventory."""
    def start(executor: str):
        platform = make_platform(tmp_path / executor, database_url, executor=executor, local_gpus=1,
                                 admin_api_key=ADMIN_KEY)
        add_base_model(platform, "tiny-base", tiny_model_dir)
        key = add_tenant(platform, "acme")
        http = TestClient(create_app(platform=platform))
        auth = {"Authorization": f"Bearer {key}"}
        file_id = http.post("/v1/files", files={"file": ("t.jsonl", io.BytesIO(chat_lines(20)))},
                            data={"purpose": "fine-tune"}, headers=auth).json()["id"]
        body = {"model": "tiny-base", "training_file": file_id, "resources": {"gpus": 8}}
        created = http.post("/v1/fine_tuning/jobs", json=body, headers=auth)
        assert created.status_code == 200, created.text
        opened.append((platform, http))
        return http, auth, created.json()["id"]

    opened = []
    yield start
    for platform, http in opened:
        http.close()
        platform.db.dispose()


def test_a_ray_standby_does_not_fail_a_big_job_against_its_local_gpus(standby):
    http, auth, job_id = standby("ray")
    job = http.get(f"/v1/fine_tuning/jobs/{job_id}", headers=auth).json()
    assert job["status"] == "queued" and job["error"] is None
    assert job["queue"] == {"position": 1, "estimated_start": None}  # its start is unknown here
    queue = http.get("/v1/admin/queue", headers={"Authorization": f"Bearer {ADMIN_KEY}"}).json()["data"]
    assert [(e["job_id"], e["position"], e["estimated_start"]) for e in queue] == [(job_id, 1, None)]
    samples, _types = scrape(http)
    assert ("tuneforge_gpus", ()) not in samples  # unknown: no sample, rather than a wrong one
    assert ("tuneforge_gpu_utilization_ratio", ()) not in samples
    assert samples[("tuneforge_gpus_busy", ())] == 0


def test_the_local_executor_judges_against_its_configured_slots(standby):
    http, auth, job_id = standby("local")  # one slot
    job = http.get(f"/v1/fine_tuning/jobs/{job_id}", headers=auth).json()
    assert job["status"] == "failed" and job["error"]["code"] == "resources_unavailable"
    assert "resources.gpus = 8 cannot be placed" in job["error"]["message"]
    samples, _types = scrape(http)
    assert samples[("tuneforge_gpus", ())] == 1


@pytest.fixture
def l4_host(tmp_path, database_url, tiny_model_dir):
    """The API of a local platform whose one node reports an NVIDIA L4 of `memory_gb` GiB."""
    def start(memory_gb: float = 24.0):
        platform = make_platform(tmp_path / f"l4-{memory_gb}", database_url, local_gpus=2,
                                 local_gpu_model="NVIDIA L4", local_gpu_memory_gb=memory_gb)
        add_base_model(platform, "tiny-base", tiny_model_dir)
        key = add_tenant(platform, "acme")
        http = TestClient(create_app(platform=platform))
        auth = {"Authorization": f"Bearer {key}"}
        file_id = http.post("/v1/files", files={"file": ("t.jsonl", io.BytesIO(chat_lines(20)))},
                            data={"purpose": "fine-tune"}, headers=auth).json()["id"]
        opened.append((platform, http))

        def create(**resources):
            return http.post("/v1/fine_tuning/jobs", headers=auth,
                             json={"model": "tiny-base", "training_file": file_id, "resources": resources})

        return http, auth, create

    opened = []
    yield start
    for platform, http in opened:
        http.close()
        platform.db.dispose()


def test_a_job_asking_for_gpus_that_exist_nowhere_is_refused_with_the_field_and_what_exists(l4_host):
    http, auth, create = l4_host(24.0)
    big = create(gpu_memory_gb=70)
    assert big.status_code == 400, big.text
    error = big.json()["error"]
    assert error["param"] == "resources.gpu_memory_gb" and error["code"] == "resources_unavailable"
    assert error["message"] == ("resources.gpu_memory_gb: the job needs 70 GB per GPU; the largest GPUs here have "
                                "24 GB (local: NVIDIA L4)")
    other = create(gpu_type="h100")
    assert other.status_code == 400 and other.json()["error"]["param"] == "resources.gpu_type"
    assert "NVIDIA L4" in other.json()["error"]["message"]
    suffix = create(gpu_type="l4-48gb")
    assert suffix.status_code == 400 and suffix.json()["error"]["param"] == "resources.gpu_memory_gb"
    fits = create(gpu_type="L4", gpu_memory_gb=20)
    assert fits.status_code == 200, fits.text
    job = http.get(f"/v1/fine_tuning/jobs/{fits.json()['id']}", headers=auth).json()
    assert job["status"] == "queued", job["error"]


def test_a_plan_needing_more_memory_than_any_gpu_has_fails_validation_naming_the_memory(l4_host):
    http, auth, create = l4_host(0.5)  # smaller than the tiny model's step with the CUDA runtime
    created = create(gpus=1)
    assert created.status_code == 200, created.text
    job = http.get(f"/v1/fine_tuning/jobs/{created.json()['id']}", headers=auth).json()
    assert job["status"] == "failed" and job["error"]["code"] == "resources_unavailable"
    assert job["error"]["param"] == "resources.gpu_memory_gb"
    assert job["error"]["message"].startswith("needs ") and "the largest GPUs here have 0.5 GB (local: NVIDIA L4)" \
        in job["error"]["message"]


def test_a_default_plan_uses_the_memory_of_the_gpus_in_the_inventory(l4_host):
    http, auth, create = l4_host(24.0)
    created = create()
    assert created.status_code == 200, created.text
    job_id = created.json()["id"]
    assert http.get(f"/v1/fine_tuning/jobs/{job_id}", headers=auth).json()["status"] == "queued"
    platform = http.app.state.platform
    with platform.db.session() as session:
        resources = session.scalars(select(Job).where(Job.job_id == job_id)).one().resolved.resources
    assert platform.settings.gpu_memory_gb == 80.0 and resources.gpu_memory_gb == 24.0  # the L4s, not the default
    assert 0 < resources.min_gpu_memory_gb <= 24.0 and resources.required_gpu_type == ""
