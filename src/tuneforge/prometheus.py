"""Prometheus metrics, with prometheus-client.

Two kinds:

- **The platform's state**, read from the database at each scrape (`PlatformCollector`): queue
  depth and longest wait per tier, jobs by status, running jobs, GPUs and their use, preemptions,
  GPU-seconds, webhook deliveries. Every API process reads the same database, so every scrape
  gives the whole platform's view whichever worker answers.
- **What an API process sees**, counted where it happens: request latency per route and status
  (`RequestMetrics`, a histogram), optimizer steps reported by trainers. With several
  API workers these live in prometheus-client's multiprocess mode: the parent process sets
  PROMETHEUS_MULTIPROC_DIR (a fresh folder under HOME) before it starts the workers, each worker
  writes its samples there, and a scrape of any worker sums them all (`exposition`).

Names and types follow Prometheus' conventions: base units (`_seconds`), `_total` on counters
only, `_ratio` for 0–1 gauges. No label holds a tenant's name, a job id or any tenant data.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
disable_created_metrics()  # no `_created` gauge beside every counter: noise for Prometheus
# the classic text format, which every Prometheus server reads (generate_latest writes it)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

REQUEST_SECONDS = Histogram(
    "tuneforge_http_request_duration_seconds",
    "Time from a request's arrival to its response's headers, by route template, method and status.",
    ["route", "method", "status"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0))
TRAINER_STEPS = Counter("tuneforge_trainer_steps", "Optimizer steps trainers reported (their metrics events); "
                                                   "rate() of it is the platform's step rate.")


def prepare_multiprocess(home: Path) -> Path:
    """The parent of several API workers: a fresh folder for their samples, named in the
    environment the workers inherit. Call before the workers start."""
    folder = home / "prometheus-multiproc"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True, mode=0o700)
    os.environ[MULTIPROC_ENV] = str(folder)
    return folder


class RequestMetrics:
    """ASGI middleware: each HTTP request's latency (to its response's headers, so a stream counts
    until it starts) into REQUEST_SECONDS, labelled by the route's template (`/v1/files/{file_id}`),
    never by the path a client sent."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        recorded = False

        async def timed_send(message: Message) -> None:
            nonlocal recorded
            if message["type"] == "http.response.start" and not recorded:
                recorded = True
                _observe(scope, message["status"], time.perf_counter() - started)
            await send(message)

        try:
            await self.app(scope, receive, timed_send)
        finally:
            if not recorded:  # the app failed before answering (the server answers 500)
                _observe(scope, 500, time.perf_counter() - started)


def _observe(scope: Scope, status: int, seconds: float) -> None:
    route = scope.get("route")
    template = getattr(route, "path", None) or "unmatched"
    REQUEST_SECONDS.labels(template, scope.get("method", ""), str(status)).observe(seconds)


def count_trainer_steps(steps: int) -> None:
    if steps > 0:
        TRAINER_STEPS.inc(steps)


# What trainers' GPUs said (train/gpu_telemetry.py), one observation per reported step: the
# distribution over the platform's running trainers, never per job (no job id in a label)
GPU_UTILIZATION = Histogram("tuneforge_trainer_gpu_utilization_ratio",
                            "Busy share of trainers' GPUs (NVML) over each reported step (0 to 1).",
                            buckets=(0.1, 0.25, 0.5, 0.75, 0.9, 1.0))
GPU_MEMORY = Histogram("tuneforge_trainer_gpu_memory_used_bytes", "Memory used on trainers' GPUs (NVML) "
                       "at each reported step.", buckets=tuple(float(gib * 2**30) for gib in (8, 16, 24, 40, 80, 141)))
GPU_POWER = Histogram("tuneforge_trainer_gpu_power_watts", "Mean power of trainers' GPUs (NVML) over each "
                      "reported step.", buckets=(100.0, 200.0, 300.0, 400.0, 500.0, 700.0, 1000.0))
GPU_TEMPERATURE = Histogram("tuneforge_trainer_gpu_temperature_celsius", "Highest temperature of trainers' GPUs "
                            "(NVML) over each reported step.", buckets=(40.0, 60.0, 70.0, 80.0, 85.0, 90.0))


def observe_gpu(data: dict[str, Any]) -> None:
    """A metrics event's GPU readings, where it has numbers (free-form data: anything else is skipped)."""
    for key, histogram, scale in (("gpu_utilization", GPU_UTILIZATION, 1.0), ("gpu_memory_used_mb", GPU_MEMORY, 2**20),
                                  ("gpu_power_w", GPU_POWER, 1.0), ("gpu_temperature_c", GPU_TEMPERATURE, 1.0)):
        value = data.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            histogram.observe(float(value) * scale)


class PlatformCollector(Collector):
    """The database-derived families of one scrape (`state`: usage.Snapshot plus totals)."""

    def __init__(self, snap: Any, totals: dict[str, Any]) -> None:
        self.snap, self.totals = snap, totals

    def collect(self) -> Iterator[Metric]:
        snap = self.snap
        depth = GaugeMetricFamily("tuneforge_queue_depth", "Jobs queued to run, by their tenant's tier.",
                                  labels=["tier"])
        wait = GaugeMetricFamily("tuneforge_queue_wait_seconds",
                                 "Time in the queue of the longest-waiting queued job, by tier (0 when none).",
                                 labels=["tier"])
        for tier, count in snap.queue_depth.items():
            depth.add_metric([tier], count)
            wait.add_metric([tier], round(snap.oldest_wait_s.get(tier, 0.0), 3))
        yield depth
        yield wait
        yield GaugeMetricFamily("tuneforge_running_jobs", "Jobs running now.", value=snap.running_jobs)
        jobs = GaugeMetricFamily("tuneforge_jobs", "Jobs by current status.", labels=["status"])
        for status, count in sorted(snap.jobs_by_status.items()):
            jobs.add_metric([status], count)
        yield jobs
        if snap.gpus_total is not None:  # unknown to this process: no sample rather than a wrong one
            yield GaugeMetricFamily("tuneforge_gpus", "GPUs (or slots) the executor offers.", value=snap.gpus_total)
        yield GaugeMetricFamily("tuneforge_gpus_busy", "GPUs held by starting or running attempts.",
                                value=snap.gpus_busy)
        if snap.gpu_utilization is not None:
            yield GaugeMetricFamily("tuneforge_gpu_utilization_ratio",
                                    "GPUs held by attempts over the executor's GPUs (0 to 1): allocation, not load "
                                    "(NVML's: tuneforge_trainer_gpu_utilization_ratio).",
                                    value=round(snap.gpu_utilization, 6))
        yield CounterMetricFamily("tuneforge_preemptions", "Attempts that were preempted.", value=snap.preemptions)
        gpu_seconds = CounterMetricFamily("tuneforge_gpu_seconds", "GPU-seconds attempts held from launch to end "
                                          "(a running one's so far), by the attempt's status.",
                                          labels=["attempt_status"])
        for status, seconds in sorted(self.totals["gpu_seconds"].items()):
            gpu_seconds.add_metric([status], round(seconds, 3))
        yield gpu_seconds
        deliveries = CounterMetricFamily("tuneforge_webhook_deliveries", "Webhook deliveries by outcome "
                                         "(pending: not yet delivered, still retried).", labels=["outcome"])
        for outcome, count in sorted(self.totals["webhook_deliveries"].items()):
            deliveries.add_metric([outcome], count)
        yield deliveries


def exposition(snap: Any, totals: dict[str, Any]) -> bytes:
    """The text of one scrape: the database's families, then this process's (or, in multiprocess
    mode, every worker's) counters and histograms."""
    state = CollectorRegistry(auto_describe=False)
    state.register(PlatformCollector(snap, totals))
    if os.environ.get(MULTIPROC_ENV):
        from prometheus_client import multiprocess

        processes = CollectorRegistry(auto_describe=False)
        multiprocess.MultiProcessCollector(processes)
    else:
        processes = REGISTRY
    return generate_latest(state) + generate_latest(processes)
