"""/metrics: values on a constructed situation, and text every line of which parses."""

from __future__ import annotations

import re
import time

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.platform import add_tenant, make_platform
from tests.unit.api.test_usage import add_attempt, add_job
from tuneforge.api.app import create_app
from tuneforge.api.routes.metrics import family, render
from tuneforge.db.repos import events
from tuneforge.db.repos import jobs as job_repo
from tuneforge.executors.protocol import Capacity, NodeCapacity
from tuneforge.services import usage

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
_SAMPLE = re.compile(rf"^({_NAME})(\{{{_LABEL}(?:,{_LABEL})*\}})? (NaN|[+-]Inf|-?\d+(?:\.\d+)?(?:e[+-]?\d+)?)$")
_HELP = re.compile(rf"^# HELP ({_NAME}) .+$")
_TYPE = re.compile(rf"^# TYPE ({_NAME}) (gauge|counter)$")


def parse(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Check the exposition line by line and return {(name, labels): value}."""
    assert text.endswith("\n")
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    typed: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# HELP"):
            assert _HELP.match(line), line
        elif line.startswith("# TYPE"):
            match = _TYPE.match(line)
            assert match, line
            typed.add(match.group(1))
        else:
            match = _SAMPLE.match(line)
            assert match, line
            name, labels, value = match.groups()
            assert name in typed, f"{name} has no TYPE line before its samples"
            pairs = tuple(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', labels or ""))
            assert (name, pairs) not in samples, f"duplicate sample {line}"
            samples[(name, pairs)] = float(value)
    return samples


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


def test_metrics_endpoint_needs_no_key_and_every_line_parses(situation):
    platform, _now = situation
    with TestClient(create_app(platform=platform)) as http:
        response = http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    samples = parse(response.text)
    assert samples[("tuneforge_queue_depth", (("tier", "free"),))] == 2
    assert samples[("tuneforge_queue_depth", (("tier", "premium"),))] == 0
    assert samples[("tuneforge_queue_wait_seconds", (("tier", "standard"),))] == pytest.approx(50, abs=5)
    assert samples[("tuneforge_running_jobs", ())] == 2
    assert samples[("tuneforge_gpus_total", ())] == 4  # no scheduler in this process: the configured local slots
    assert samples[("tuneforge_gpus_busy", ())] == 3
    assert samples[("tuneforge_gpu_utilization", ())] == 0.75
    assert samples[("tuneforge_preemptions_total", ())] == 2
    assert samples[("tuneforge_jobs_total", (("status", "queued"),))] == 3
    assert samples[("tuneforge_jobs_total", (("status", "cancelled"),))] == 0
    assert len(samples) == 3 + 3 + 1 + 1 + 1 + 1 + 1 + 8
    # the reference parser agrees
    parsed = {family.name: family for family in text_string_to_metric_families(response.text)}
    assert parsed["tuneforge_gpus_busy"].type == "gauge"
    assert parsed["tuneforge_preemptions"].type == "counter"  # the parser names a counter without _total
    assert [s.value for s in parsed["tuneforge_preemptions"].samples] == [2.0]


def test_gpus_total_is_the_inventory_the_scheduler_last_saw(situation):
    platform, _now = situation
    platform.inventory = Capacity([NodeCapacity("n0", 8, 5), NodeCapacity("n1", 4, 4)])
    with TestClient(create_app(platform=platform)) as http:
        samples = parse(http.get("/metrics").text)
    assert samples[("tuneforge_gpus_total", ())] == 12
    assert samples[("tuneforge_gpu_utilization", ())] == 0.25


def test_an_empty_platform_reports_zeros(tmp_path, database_url):
    platform = make_platform(tmp_path, database_url, local_gpus=0)
    try:
        with TestClient(create_app(platform=platform)) as http:
            samples = parse(http.get("/metrics").text)
    finally:
        platform.db.dispose()
    assert samples[("tuneforge_gpu_utilization", ())] == 0  # no division by zero GPUs
    assert samples[("tuneforge_queue_wait_seconds", (("tier", "free"),))] == 0
    assert sum(v for (name, _labels), v in samples.items() if name == "tuneforge_jobs_total") == 0


def test_label_values_and_help_are_escaped():
    lines = family("x_total", "counter", "a \\ and\nnewline", [({"path": 'a"b\\c\nd'}, 1.5), ({}, float("inf"))])
    assert lines == ["# HELP x_total a \\\\ and\\nnewline", "# TYPE x_total counter",
                     'x_total{path="a\\"b\\\\c\\nd"} 1.5', "x_total +Inf"]
    assert parse("\n".join(lines) + "\n")[("x_total", (("path", 'a\\"b\\\\c\\nd'),))] == 1.5
    snap = usage.Snapshot({"free": 0}, {"free": 0.0}, 0, 0, 0, 0, {"queued": 0})
    types = [line.split()[2] for line in render(snap).splitlines() if line.startswith("# TYPE")]
    assert types == ["tuneforge_queue_depth", "tuneforge_queue_wait_seconds", "tuneforge_running_jobs",
                     "tuneforge_gpus_total", "tuneforge_gpus_busy", "tuneforge_gpu_utilization",
                     "tuneforge_preemptions_total", "tuneforge_jobs_total"]
