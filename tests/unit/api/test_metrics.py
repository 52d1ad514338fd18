"""/metrics with prometheus-client: the platform's state from the database on a constructed
situation, request latency per route, the trainers' step count; names and types by Prometheus'
conventions, read back with prometheus-client's own parser."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.platform import add_tenant, make_platform
from tests.unit.api.test_usage import add_attempt, add_job
from tuneforge.api.app import create_app
from tuneforge.db.repos import events
from tuneforge.db.repos import jobs as job_repo
from tuneforge.executors.protocol import Capacity, NodeCapacity
from tuneforge.services.tenancy import usage


def scrape(http) -> tuple[dict, dict]:  # noqa: ANN001
    """({(name, labels): value} of every sample, {family name: type}) of one scrape."""
    response = http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples, types = {}, {}
    for family in text_string_to_metric_families(response.text):
        types[family.name] = family.type
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            assert key not in samples, f"duplicate sample {key}"
            samples[key] = sample.value
    return samples, types


@pytest.fixture
def situation(tmp_path, database_url):
    """3 free, standard and premium tenants; queued, running and finished jobs on 4 GPUs."""
    platform = make_platform(tmp_path, database_url, local_gpus=4)
    for name, tier in (("f", "free"), ("s", "standard"), ("p", "premium")):
        add_tenant(platform, name, tier)
    now = time.time()
    add_job(platform, "f", "queued", created_at=now - 300)
    add_job(platform, "f", "queued", created_at=now - 100)
    requeued = add_job(platform, "s", "queued", created_at=now - 5000)  # back in the queue 50 s ago
    add_attempt(platform, requeued, 1, started_at=now - 4000, ended_at=now - 50, status="preempted",
                failure_class="preempted")
    with platform.db.session() as session:
        job_row = job_repo.get_for_update(session, requeued)
        events.add(session, job_row, "validated; job queued", data={"status": "queued"}, created_at=int(now - 4900))
        events.add(session, job_row, "preempted; requeued", data={"status": "queued"}, created_at=int(now - 50))
        # a trainer's report (it has a seq) does not move the job in the queue, whatever its data says
        events.add(session, job_row, "trainer", data={"status": "queued"}, seq=1, attempt=1,
                   created_at=int(now - 10))
    running = add_job(platform, "p", "running")
    add_attempt(platform, running, 1, started_at=now - 900, ended_at=now - 600, status="preempted",
                failure_class="preempted")
    add_attempt(platform, running, 2, started_at=now - 500, ended_at=None, gpus=2, status="running")
    starting = add_job(platform, "s", "running")
    add_attempt(platform, starting, 1, started_at=now - 5, ended_at=None, status="starting")
    done = add_job(platform, "s", "succeeded")
    add_attempt(platform, done, 1, started_at=now - 9000, ended_at=now - 8000, gpus=4)
    add_job(platform, "p", "failed")
    yield platform, now
    platform.db.dispose()


def test_snapshot_values(situation):
    platform, now = situation
    with platform.db.session() as session:
        snap = usage.snapshot(session, ("free", "standard", "premium"), 4, now)
    assert snap.queue_depth == {"free": 2, "standard": 1, "premium": 0}
    assert snap.oldest_wait_s["free"] == pytest.approx(300, abs=1)
    assert snap.oldest_wait_s["standard"] == pytest.approx(50, abs=1)
    assert snap.oldest_wait_s["premium"] == 0.0
    assert (snap.running_jobs, snap.gpus_total, snap.gpus_busy, snap.preemptions) == (2, 4, 3, 2)
    assert snap.gpu_utilization == 0.75
    assert snap.jobs_by_status == {"validating_files": 0, "queued": 3, "running": 2, "evaluating": 0,
                                   "succeeded": 1, "failed": 1, "cancelled": 0, "paused": 0}


def test_the_platforms_state_read_from_the_database(situation):
    platform, now = situation
    with TestClient(create_app(platform=platform)) as http:
        samples, types = scrape(http)
    assert samples[("tuneforge_queue_depth", (("tier", "free"),))] == 2
    assert samples[("tuneforge_queue_depth", (("tier", "premium"),))] == 0
    assert samples[("tuneforge_queue_wait_seconds", (("tier", "standard"),))] == pytest.approx(50, abs=5)
    assert samples[("tuneforge_running_jobs", ())] == 2
    assert samples[("tuneforge_gpus", ())] == 4  # no scheduler in this process: the configured local slots
    assert samples[("tuneforge_gpus_busy", ())] == 3
    assert samples[("tuneforge_gpu_utilization_ratio", ())] == 0.75
    assert samples[("tuneforge_preemptions_total", ())] == 2
    assert samples[("tuneforge_jobs", (("status", "queued"),))] == 3
    assert samples[("tuneforge_jobs", (("status", "cancelled"),))] == 0
    # GPU-seconds by attempt status: 3950 + 300 preempted, 4 x 1000 succeeded, 2 x ~500 and ~5 running/starting
    assert samples[("tuneforge_gpu_seconds_total", (("attempt_status", "preempted"),))] == pytest.approx(4250, abs=2)
    assert samples[("tuneforge_gpu_seconds_total", (("attempt_status", "succeeded"),))] == pytest.approx(4000, abs=2)
    assert samples[("tuneforge_gpu_seconds_total", (("attempt_status", "running"),))] == pytest.approx(1000, abs=10)
    assert samples[("tuneforge_webhook_deliveries_total", (("outcome", "delivered"),))] == 0
    # Prometheus' conventions: _total only on counters, base units, _ratio for a 0-1 gauge
    assert {name: kind for name, kind in types.items() if name.startswith("tuneforge_")} == {
        "tuneforge_queue_depth": "gauge", "tuneforge_queue_wait_seconds": "gauge", "tuneforge_running_jobs": "gauge",
        "tuneforge_jobs": "gauge", "tuneforge_gpus": "gauge", "tuneforge_gpus_busy": "gauge",
        "tuneforge_gpu_utilization_ratio": "gauge", "tuneforge_preemptions": "counter",
        "tuneforge_gpu_seconds": "counter", "tuneforge_webhook_deliveries": "counter",
        "tuneforge_http_request_duration_seconds": "histogram", "tuneforge_trainer_steps": "counter",
        "tuneforge_trainer_gpu_utilization_ratio": "histogram", "tuneforge_trainer_gpu_memory_used_bytes": "histogram",
        "tuneforge_trainer_gpu_power_watts": "histogram", "tuneforge_trainer_gpu_temperature_celsius": "histogram"}


def test_request_latency_is_counted_per_route_template_and_status(situation):
    platform, _now = situation
    key = add_tenant(platform, "latency", "standard")

    def count(samples: dict, route: str, status: str) -> float:
        return samples.get(("tuneforge_http_request_duration_seconds_count",
                            (("method", "GET"), ("route", route), ("status", status))), 0.0)

    with TestClient(create_app(platform=platform)) as http:
        before, _ = scrape(http)
        for file_id in ("file-a", "file-b", "file-c"):
            assert http.get(f"/v1/files/{file_id}", headers={"Authorization": f"Bearer {key}"}).status_code == 404
        assert http.get("/v1/files", headers={"Authorization": f"Bearer {key}"}).status_code == 200
        assert http.get("/v1/no/such/path").status_code == 404
        after, _ = scrape(http)
    assert count(after, "/v1/files/{file_id}", "404") - count(before, "/v1/files/{file_id}", "404") == 3
    assert count(after, "/v1/files", "200") - count(before, "/v1/files", "200") == 1
    assert count(after, "unmatched", "404") - count(before, "unmatched", "404") == 1
    assert not [labels for (name, labels) in after if "file-a" in str(labels)]  # never a path a client sent
    assert count(after, "/metrics", "200") >= 1


def test_gpus_total_is_the_inventory_the_scheduler_last_saw(situation):
    platform, _now = situation
    platform.inventory = Capacity([NodeCapacity("n0", 8, 5), NodeCapacity("n1", 4, 4)])
    with TestClient(create_app(platform=platform)) as http:
        samples, _ = scrape(http)
    assert samples[("tuneforge_gpus", ())] == 12
    assert samples[("tuneforge_gpu_utilization_ratio", ())] == 0.25


def test_an_empty_platform_reports_zeros(tmp_path, database_url):
    platform = make_platform(tmp_path, database_url, local_gpus=0)
    try:
        with TestClient(create_app(platform=platform)) as http:
            samples, _ = scrape(http)
    finally:
        platform.db.dispose()
    assert samples[("tuneforge_gpu_utilization_ratio", ())] == 0  # no division by zero GPUs
    assert samples[("tuneforge_queue_wait_seconds", (("tier", "free"),))] == 0
    assert sum(v for (name, _labels), v in samples.items() if name == "tuneforge_jobs") == 0


def test_the_grafana_dashboard_queries_only_what_the_exporter_exposes(situation):
    import json
    import re
    from pathlib import Path

    platform, _now = situation
    with TestClient(create_app(platform=platform)) as http:
        http.get("/v1/models")  # one request, so the latency histogram has samples
        samples, _types = scrape(http)
    exposed = {name for name, _labels in samples}
    dashboard = json.loads((Path(__file__).parents[3] / "deploy" / "grafana" / "tuneforge.json").read_text())
    queried = {name for panel in dashboard["panels"] for target in panel["targets"]
               for name in re.findall(r"\btuneforge_[a-z_]+", target["expr"])}
    assert queried and queried <= exposed, sorted(queried - exposed)
    assert len(dashboard["panels"]) == len({panel["id"] for panel in dashboard["panels"]})
