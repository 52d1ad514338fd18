"""API latency of the control plane under concurrent load, over a matrix of
databases and API worker counts; optionally submit-to-trainer-start latency.

    python benchmarks/api_latency.py [--database sqlite,postgres] [--workers 1,2] [--clients 50]
                                     [--requests 2000] [--generator-processes 1] [--quick]

    # smoke run: one combination, few requests
    python benchmarks/api_latency.py --quick --workers 1 --database sqlite

    # PostgreSQL: by default the script starts a throwaway server itself with
    # scripts/pg.sh on --pg-port (54339; the test suite's 54329 is left alone) and
    # stops it at the end; a server already running there from the same
    # TUNEFORGE_PG_DIR (default /tmp/tfbench-pg) is used and left running:
    TUNEFORGE_PG_DIR=/tmp/tfbench-pg bash scripts/pg.sh start 54339
    python benchmarks/api_latency.py --database postgres --database-url "$(bash scripts/pg.sh url 54339)"
    TUNEFORGE_PG_DIR=/tmp/tfbench-pg bash scripts/pg.sh stop 54339

The goal measured: with 50 concurrent clients on this machine, GET job p99 <=
200 ms and GET job throughput >= 0.5x that of /healthz in the same run, on
SQLite and on PostgreSQL, with API workers 1 and N. Each combination prints a
PASS/FAIL line for it (printed, never asserted).

For each (database, workers) combination: a fresh TUNEFORGE_HOME built through
the real CLI (migrate, a tenant with its quotas lifted, a base model whose
tokenizer is real so that a create's inline validation succeeds), a fresh
database (SQLite in the home, or a new database on the PostgreSQL server),
then `tuneforge serve --no-scheduler` as a separate process on 127.0.0.1 with
TUNEFORGE_API_WORKERS=N and TUNEFORGE_RATE_LIMITS (no limits unless
--rate-limits says otherwise; a server that does not know a variable ignores
it). Setup creates SEED_JOBS jobs and cancels all but the first, which is the
job read back. Phases, each after a warm-up on the same connections:

  healthz      GET  /healthz                                  the FastAPI + uvicorn floor of the same server
  get job      GET  /v1/fine_tuning/jobs/{id}                 API key lookup, one job row, its queue place
  list jobs    GET  /v1/fine_tuning/jobs?limit=20             a page of 20 jobs
  get events   GET  /v1/fine_tuning/jobs/{id}/events?limit=20 a page of the job's events (not streamed)
  create job   POST /v1/fine_tuning/jobs                      checks, inserts, inline validation of a small file

after which the jobs the create phase made are cancelled (so that later
phases and the queue place of the job read back do not depend on them). The
same phases then run with one client (latency without queueing).

Per phase: latency percentiles of the successful requests, throughput and its
ratio to /healthz's, failed requests by kind (429 - rate limits or queue caps
- apart from 5xx, from timeouts and from anything else), CPU per request of the
server's whole process tree (supervisor and workers) and of the load
generator, and the cores kept busy by each and by everything else. The load
generator is asyncio with one keep-alive connection per client, in this
process or (--generator-processes K) split over K forked processes whose
latencies are merged. Its HTTP client (--client) is by default `raw`: HTTP/1.1
written and read directly over asyncio streams, about a tenth of httpx's CPU
per request, so that on a 2-core machine the generator leaves the cores to the
server it measures; `--client httpx` measures with httpx (the openai SDK's
client) instead. A summary table across combinations ends the run.

--trainer-jobs N (default 0: it is slow) then restarts the control plane of the
first combination with its scheduler and fine-tunes a real tiny model N times
in a row to time submit -> `running` -> first trainer report (see
benchmarks/trainer_start.py).

Every loop is bounded by a count and a deadline (a request in flight when its
phase's deadline passes is cut off and counted); every process started here
(servers and their workers, load generator processes, the PostgreSQL server
the script started) is stopped on exit, errors and Ctrl-C included. Traffic
goes to 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import multiprocessing
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from contextlib import AsyncExitStack, ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import (  # noqa: E402 - benchmarks/ is not a package
    CLI_TIMEOUT_S,
    BenchHome,
    PostgresDatabase,
    PySpy,
    ServerProcess,
    fake_model_dir,
    load_average,
    local_client,
    machine_lines,
    read_machine_cpu_s,
    upload_training_file,
)

REPO = Path(__file__).resolve().parents[1]
BENCH_MODEL = "bench-fake"
REQUEST_TIMEOUT_S = 30.0
MAX_LIST_PAGES = 1000
OTHER_CORES_WARNING = 0.25
GENERATOR_BUSY_WARNING = 0.85  # cores per generator process: above this it is the bottleneck
SEED_JOBS = 25  # more than a page of the list phase
CANCEL_CLIENTS = 8
DRAIN_S = REQUEST_TIMEOUT_S + 5.0
CANCEL_DEADLINE_S = 600.0
CHILD_START_TIMEOUT_S = 60.0
GOAL_CLIENTS = 50
GOAL_P99_MS = 200.0
GOAL_RATIO = 0.5
NO_RATE_LIMITS = '{"free":null,"standard":null,"premium":null}'
DATABASES = ("sqlite", "postgres")
# --quick: fewer requests, shorter deadlines (a smoke run, not figures to quote)
QUICK = {"requests": 300, "warmup": 50, "serial_requests": 50, "phase_timeout_s": 60.0}
FULL = {"requests": 2000, "warmup": 200, "serial_requests": 300, "phase_timeout_s": 600.0}

# the tokenizer of the bench model: built once per run in a subprocess (the
# benchmark process itself never imports transformers)
_BUILD_TOKENIZER = (
    "import sys; from tuneforge.demo.tiny_model import build_tokenizer; "
    "build_tokenizer().save_pretrained(sys.argv[1])"
)


# ---- statistics ---------------------------------------------------------------
def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (q in 0..100)."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


TIMEOUT = "timeout"
CUT = "cut at deadline"


def error_kind(outcome: str) -> str:
    """429 | 5xx | timeout | cut | other, for an outcome that is not a 200."""
    if outcome == "429":
        return "429"
    if outcome.isdigit() and int(outcome) >= 500:
        return "5xx"
    if outcome == TIMEOUT:
        return "timeout"
    if outcome == CUT:
        return "cut"
    return "other"


@dataclass
class PhaseResult:
    name: str
    request: str
    clients: int
    latencies_s: list[float] = field(default_factory=list)
    errors: Counter = field(default_factory=Counter)  # outcome (status code, "timeout", ...) -> count
    warmup_errors: Counter = field(default_factory=Counter)
    wall_s: float = 0.0
    server_cpu_s: float = 0.0  # the server's whole process tree
    client_cpu_s: float = 0.0  # the load generator, all its processes
    machine_cpu_s: float = 0.0  # every process on the machine, these two included
    stolen_cpu_s: float = 0.0  # the hypervisor gave our cores to someone else
    server_processes: int = 0
    generator_processes: int = 1
    not_done: int = 0  # measured requests never sent: the deadline came first

    def ms(self, q: float) -> float:
        return percentile(sorted(self.latencies_s), q) * 1000

    @property
    def max_ms(self) -> float:
        return max(self.latencies_s, default=math.nan) * 1000

    @property
    def throughput(self) -> float:
        """Successful requests per second."""
        return len(self.latencies_s) / self.wall_s if self.wall_s else math.nan

    @property
    def failed(self) -> int:
        return sum(self.errors.values())

    def failed_by_kind(self) -> Counter:
        kinds = Counter()
        for outcome, count in self.errors.items():
            kinds[error_kind(outcome)] += count
        return kinds

    def cores(self, cpu_s: float) -> float:
        return cpu_s / self.wall_s if self.wall_s else math.nan

    @property
    def other_cores(self) -> float:
        """Cores kept busy by everything but the server and the generator (the database server, other work)."""
        return self.cores(self.machine_cpu_s - self.server_cpu_s - self.client_cpu_s)

    def cpu_ms_per_request(self, cpu_s: float) -> float:
        done = len(self.latencies_s) + self.failed
        return cpu_s / done * 1000 if done else math.nan


# ---- the load generator ------------------------------------------------------
@dataclass(frozen=True)
class RequestSpec:
    """One kind of request, as data (it crosses into forked generator processes)."""
    method: str
    path: str
    params: dict[str, Any] | None = None
    body: dict[str, Any] | None = None

    @property
    def label(self) -> str:
        query = "?" + "&".join(f"{k}={v}" for k, v in self.params.items()) if self.params else ""
        return f"{self.method} {self.path}{query}"

    async def send(self, client: httpx.AsyncClient, timeout_s: float) -> httpx.Response:
        return await client.request(self.method, self.path, params=self.params, json=self.body, timeout=timeout_s)


@dataclass
class GeneratorRun:
    """What one generator (this process, or one forked process) measured."""
    latencies_s: list[float] = field(default_factory=list)
    errors: Counter = field(default_factory=Counter)
    warmup_errors: Counter = field(default_factory=Counter)
    started: float = 0.0  # time.monotonic() of the first measured request (the clock is system-wide)
    ended: float = 0.0
    cpu_s: float = 0.0  # process CPU during the measured requests
    sent: int = 0


class RequestTimeout(Exception):
    """A request got no whole answer within its time."""


class RawConnection:
    """One keep-alive HTTP/1.1 connection spoken over asyncio streams, for the `raw` client: the
    request's bytes are built once, an answer is read by its Content-Length (or its chunks). It
    costs a fraction of httpx's CPU per request, so the load generator leaves the cores to the
    server it measures. A connection that failed is opened again for the next request."""

    def __init__(self, url: str, headers: dict[str, str], spec: RequestSpec) -> None:
        parsed = httpx.URL(url)
        self.host, self.port = parsed.host, parsed.port
        target = spec.path + ("?" + str(httpx.QueryParams(spec.params)) if spec.params else "")
        body = json.dumps(spec.body).encode() if spec.body is not None else b""
        lines = [f"{spec.method} {target} HTTP/1.1", f"Host: {self.host}:{self.port}",
                 *(f"{name}: {value}" for name, value in headers.items()), "Connection: keep-alive"]
        if spec.body is not None:
            lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
        self.request = ("\r\n".join(lines) + "\r\n\r\n").encode() + body
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def send(self, timeout_s: float) -> int:
        try:
            return await asyncio.wait_for(self._exchange(), timeout_s)
        except asyncio.TimeoutError:
            self.close()
            raise RequestTimeout from None
        except (OSError, asyncio.IncompleteReadError, ValueError):
            self.close()
            raise

    async def _exchange(self) -> int:
        if self.writer is not None and (self.reader.at_eof() or self.writer.is_closing()):
            self.close()  # the server closed it while it was idle (its keep-alive timeout), as httpx checks too
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        self.writer.write(self.request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        lowered = head.lower()
        at = lowered.find(b"\r\ncontent-length:")
        if at >= 0:
            await self.reader.readexactly(int(lowered[at + 17:lowered.index(b"\r\n", at + 2)]))
        elif b"\r\ntransfer-encoding: chunked" in lowered:
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                await self.reader.readexactly(size + 2)
                if size == 0:
                    break
        if b"\r\nconnection: close" in lowered:
            self.close()
        return status

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


class HttpxConnection:
    """One keep-alive connection of httpx, for the `httpx` client (what the openai SDK uses)."""

    def __init__(self, client: httpx.AsyncClient, spec: RequestSpec) -> None:
        self.client, self.spec = client, spec

    async def send(self, timeout_s: float) -> int:
        try:
            return (await self.spec.send(self.client, timeout_s)).status_code
        except httpx.TimeoutException:
            raise RequestTimeout from None


CLIENTS = ("raw", "httpx")


async def _drive(pool: list[RawConnection | HttpxConnection], total: int, deadline: float,
                 latencies: list[float] | None, errors: Counter) -> int:
    """Send `total` requests over the pool, one in flight per client, until done or the
    deadline; a request still in flight at the deadline is cut off. Returns how many were sent."""
    counter = itertools.count()
    sent = 0

    async def worker(connection: RawConnection | HttpxConnection) -> None:
        nonlocal sent
        while next(counter) < total:
            timeout_s = min(REQUEST_TIMEOUT_S, deadline - time.monotonic())
            if timeout_s <= 0:
                return
            sent += 1
            started = time.perf_counter()
            try:
                outcome = str(await connection.send(timeout_s))
            except RequestTimeout:
                outcome = CUT if timeout_s < REQUEST_TIMEOUT_S and time.monotonic() >= deadline - 0.01 else TIMEOUT
            except (httpx.HTTPError, OSError, asyncio.IncompleteReadError, ValueError) as exc:
                outcome = type(exc).__name__
            elapsed = time.perf_counter() - started
            if outcome == "200":
                if latencies is not None:
                    latencies.append(elapsed)
            else:
                errors[outcome] += 1

    await asyncio.gather(*(worker(connection) for connection in pool))
    return sent


async def generate(url: str, headers: dict[str, str], spec: RequestSpec, clients: int, warmup: int,
                   requests: int, deadline: float, ready: Callable[[], None], client: str = "raw") -> GeneratorRun:
    """Open `clients` keep-alive connections (`client`: raw or httpx), warm them up, call `ready()`
    (which returns when the measured part may start), then send the measured requests."""
    run = GeneratorRun()
    async with AsyncExitStack() as stack:
        if client == "httpx":
            pool: list[RawConnection | HttpxConnection] = [HttpxConnection(
                await stack.enter_async_context(httpx.AsyncClient(
                    base_url=url, headers=headers, timeout=REQUEST_TIMEOUT_S, trust_env=False,
                    limits=httpx.Limits(max_connections=1, max_keepalive_connections=1))), spec)
                for _ in range(clients)]
        else:
            pool = [RawConnection(url, headers, spec) for _ in range(clients)]
            for connection in pool:
                stack.callback(connection.close)
        await _drive(pool, warmup, deadline, None, run.warmup_errors)
        ready()
        cpu = time.process_time()
        run.started = time.monotonic()
        run.sent = await _drive(pool, requests, deadline, run.latencies_s, run.errors)
        run.ended = time.monotonic()
        run.cpu_s = time.process_time() - cpu
    return run


def _generator_child(index: int, url: str, headers: dict[str, str], spec: RequestSpec, clients: int,
                     warmup: int, requests: int, deadline: float, go: Any, out: Any, client: str) -> None:
    """A forked generator process: reports ("ready", i) after its warm-up, waits for `go`,
    then reports ("result", i, GeneratorRun)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)

    def ready() -> None:
        out.put(("ready", index))
        go.wait(max(0.0, deadline - time.monotonic()))

    try:
        out.put(("result", index, asyncio.run(generate(url, headers, spec, clients, warmup, requests,
                                                       deadline, ready, client))))
    except KeyboardInterrupt:
        pass
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises
        out.put(("failed", index, repr(exc)))


def split(total: int, weights: list[int]) -> list[int]:
    """`total` split in proportion to `weights` (largest remainders), summing to `total`."""
    whole = sum(weights)
    shares = [total * w // whole for w in weights]
    order = sorted(range(len(weights)), key=lambda i: (total * weights[i]) % whole, reverse=True)
    for i in order[:total - sum(shares)]:
        shares[i] += 1
    return shares


class Meter:
    """CPU readings of the server's process tree and of the machine, around a measured part."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server

    def start(self) -> None:
        self.server_cpu = self.server.tree_cpu_s()
        self.machine_cpu, self.stolen_cpu = read_machine_cpu_s()
        self.processes = self.server.process_count()

    def stop(self, result: PhaseResult) -> None:
        result.server_cpu_s = self.server.tree_cpu_s() - self.server_cpu
        machine, stolen = read_machine_cpu_s()
        result.machine_cpu_s, result.stolen_cpu_s = machine - self.machine_cpu, stolen - self.stolen_cpu
        result.server_processes = max(self.processes, self.server.process_count())


def _merge(result: PhaseResult, runs: list[GeneratorRun], go_time: float | None = None) -> None:
    for run in runs:
        result.latencies_s += run.latencies_s
        result.errors.update(run.errors)
        result.warmup_errors.update(run.warmup_errors)
    started = go_time if go_time is not None else min(run.started for run in runs)
    result.wall_s = max(run.ended for run in runs) - started


def run_phase_in_process(server: ServerProcess, spec: RequestSpec, result: PhaseResult, *, warmup: int,
                         requests: int, headers: dict[str, str], deadline: float, client: str) -> int:
    meter = Meter(server)
    run = asyncio.run(generate(server.url, headers, spec, result.clients, warmup, requests, deadline,
                               meter.start, client))
    meter.stop(result)
    result.client_cpu_s = run.cpu_s
    _merge(result, [run])
    return run.sent


def run_phase_forked(server: ServerProcess, spec: RequestSpec, result: PhaseResult, *, processes: int,
                     warmup: int, requests: int, headers: dict[str, str], deadline: float, client: str) -> int:
    context = multiprocessing.get_context("fork")
    per_process = [c for c in split(result.clients, [1] * processes) if c > 0]
    warmups, totals = split(warmup, per_process), split(requests, per_process)
    go, out = context.Event(), context.Queue()
    finished = False
    children = [context.Process(target=_generator_child, name=f"tfbench-generator-{i}", daemon=True,
                                args=(i, server.url, headers, spec, clients, warmups[i], totals[i], deadline, go,
                                      out, client))
                for i, clients in enumerate(per_process)]
    try:
        for child in children:
            child.start()
        ready = 0
        while ready < len(children):
            message = out.get(timeout=max(1.0, min(deadline - time.monotonic(), CHILD_START_TIMEOUT_S * 10)))
            if message[0] == "failed":
                raise RuntimeError(f"load generator process {message[1]} failed: {message[2]}")
            ready += message[0] == "ready"
        meter = Meter(server)
        meter.start()
        own_cpu = time.process_time()
        go_time = time.monotonic()
        go.set()
        runs: list[GeneratorRun] = []
        while len(runs) < len(children):
            message = out.get(timeout=max(1.0, deadline - time.monotonic() + REQUEST_TIMEOUT_S))
            if message[0] == "failed":
                raise RuntimeError(f"load generator process {message[1]} failed: {message[2]}")
            runs.append(message[2])
        meter.stop(result)
        result.client_cpu_s = time.process_time() - own_cpu + sum(run.cpu_s for run in runs)
        _merge(result, runs, go_time)
        finished = True
        return sum(run.sent for run in runs)
    except queue.Empty:
        raise RuntimeError("a load generator process did not report in time") from None
    finally:
        for child in children:
            if finished:
                child.join(5.0)  # it has reported: it is only exiting
            if child.is_alive():
                child.terminate()
                child.join(5.0)
            if child.is_alive():
                child.kill()
                child.join(5.0)
        out.close()
        out.join_thread()


def run_phase(server: ServerProcess, name: str, spec: RequestSpec, *, clients: int, requests: int, warmup: int,
              headers: dict[str, str], timeout_s: float, generator_processes: int,
              profile_path: Path | None = None, client: str = "raw") -> PhaseResult:
    processes = max(1, min(generator_processes, clients))
    result = PhaseResult(name, spec.label, clients, generator_processes=processes)
    deadline = time.monotonic() + timeout_s
    with ExitStack() as profiling:
        if profile_path is not None:
            profiling.enter_context(PySpy(server.proc.pid, profile_path, timeout_s, subprocesses=True))
        if processes == 1:
            sent = run_phase_in_process(server, spec, result, warmup=warmup, requests=requests, headers=headers,
                                        deadline=deadline, client=client)
        else:
            sent = run_phase_forked(server, spec, result, processes=processes, warmup=warmup, requests=requests,
                                    headers=headers, deadline=deadline, client=client)
    result.not_done = requests - sent
    if result.not_done or result.errors.get(CUT):
        print(f"  ! {name}: stopped at the {timeout_s:.0f}s deadline ({result.not_done} measured requests not "
              f"sent, {result.errors.get(CUT, 0)} cut off in flight)", flush=True)
    return result


# ---- reporting -------------------------------------------------------------------
def _f(value: float, digits: int = 2) -> str:
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


def _errors_detail(errors: Counter) -> str:
    return ", ".join(f"{k} x{v}" for k, v in sorted(errors.items())) or "none"


def print_table(results: list[PhaseResult]) -> None:
    base = results[0]
    print("| phase | request | ok | 429 | 5xx | timeouts | cut at deadline | other failed | p50 ms | p95 ms "
          "| p99 ms | max ms | req/s | x healthz req/s | server CPU ms/req | generator CPU ms/req | server cores "
          "| generator cores | other cores | server processes |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        kinds = r.failed_by_kind()
        print(f"| {r.name} | `{r.request}` | {len(r.latencies_s)} | {kinds['429']} | {kinds['5xx']} "
              f"| {kinds['timeout']} | {kinds['cut']} | {kinds['other']} | {_f(r.ms(50))} | {_f(r.ms(95))} "
              f"| {_f(r.ms(99))} "
              f"| {_f(r.max_ms)} | {_f(r.throughput, 0)} | {_f(r.throughput / base.throughput)} "
              f"| {_f(r.cpu_ms_per_request(r.server_cpu_s))} | {_f(r.cpu_ms_per_request(r.client_cpu_s))} "
              f"| {_f(r.cores(r.server_cpu_s))} | {_f(r.cores(r.client_cpu_s))} | {_f(r.other_cores)} "
              f"| {r.server_processes} |")
    for r in results:
        if r.errors:
            print(f"  {r.name}: failed requests: {_errors_detail(r.errors)}")
        if r.warmup_errors:
            print(f"  {r.name}: failed warm-up requests (not in the table): {_errors_detail(r.warmup_errors)}")
    busy = [f"{r.name} ({r.other_cores:.2f})" for r in results if r.other_cores > OTHER_CORES_WARNING]
    if busy:
        print(f"! other processes kept cores busy during: {', '.join(busy)}; with a database server on this "
              f"machine that is expected, otherwise these figures are skewed by other work")
    stolen = [f"{r.name} ({r.stolen_cpu_s / r.wall_s:.2f})" for r in results
              if r.wall_s and r.stolen_cpu_s / r.wall_s > OTHER_CORES_WARNING]
    if stolen:
        print(f"! the hypervisor took cores away (stolen cores) during: {', '.join(stolen)}")
    saturated = [f"{r.name} ({r.cores(r.client_cpu_s) / r.generator_processes:.2f})" for r in results
                 if r.cores(r.client_cpu_s) / r.generator_processes > GENERATOR_BUSY_WARNING]
    if saturated:
        print(f"! the load generator kept its core(s) busy (cores per generator process) during: "
              f"{', '.join(saturated)}: there the throughput is bounded by the generator, not only by the server "
              f"(try --generator-processes)")


@dataclass
class Goal:
    passed: bool
    line: str


def goal(results: list[PhaseResult]) -> Goal:
    by_name = {r.name: r for r in results}
    healthz, job = by_name["healthz"], by_name["get job"]
    ratio = job.throughput / healthz.throughput
    p99 = job.ms(99)
    failed = job.failed + job.not_done
    passed = p99 <= GOAL_P99_MS and ratio >= GOAL_RATIO and failed == 0
    note = "" if job.clients == GOAL_CLIENTS else f"; the goal is stated for {GOAL_CLIENTS} clients"
    return Goal(passed, f"GOAL {'PASS' if passed else 'FAIL'}: GET job with {job.clients} clients: "
                        f"p99 {_f(p99, 1)} ms (<= {GOAL_P99_MS:.0f}), {_f(ratio)}x the healthz throughput "
                        f"(>= {GOAL_RATIO}), {failed} failed or unsent requests (0){note}")


@dataclass
class Combination:
    database: str
    workers: int
    description: str = ""
    concurrent: list[PhaseResult] = field(default_factory=list)
    serial: list[PhaseResult] = field(default_factory=list)
    goal: Goal | None = None
    error: str = ""


def print_summary(combinations: list[Combination], clients: int) -> None:
    print(f"\n== summary: {clients} clients, every combination ==\n")
    print("| database | API workers | server processes | phase | p50 ms | p99 ms | req/s | x healthz req/s "
          "| failed (429 / 5xx / timeout / cut / other) | server CPU ms/req | server cores | generator cores |")
    print("|---|---:|---:|---|---:|---:|---:|---:|---|---:|---:|---:|")
    for combo in combinations:
        if not combo.concurrent:
            print(f"| {combo.database} | {combo.workers} | - | (no result: {combo.error or 'skipped'}) "
                  f"| | | | | | | | |")
            continue
        base = combo.concurrent[0]
        for r in combo.concurrent:
            k = r.failed_by_kind()
            print(f"| {combo.database} | {combo.workers} | {r.server_processes} | {r.name} | {_f(r.ms(50))} "
                  f"| {_f(r.ms(99))} | {_f(r.throughput, 0)} | {_f(r.throughput / base.throughput)} "
                  f"| {k['429']} / {k['5xx']} / {k['timeout']} / {k['cut']} / {k['other']} "
                  f"| {_f(r.cpu_ms_per_request(r.server_cpu_s))} | {_f(r.cores(r.server_cpu_s))} "
                  f"| {_f(r.cores(r.client_cpu_s))} |")
    print()
    for combo in combinations:
        line = combo.goal.line if combo.goal else f"GOAL FAIL: no result ({combo.error or 'skipped'})"
        print(f"{combo.database}, {combo.workers} API worker(s): {line}")


# ---- setup through the CLI and the API ----------------------------------------
def build_tokenizer_dir(env: dict[str, str], out_dir: Path) -> Path:
    done = subprocess.run([sys.executable, "-c", _BUILD_TOKENIZER, str(out_dir)], env=env, capture_output=True,
                          text=True, timeout=CLI_TIMEOUT_S, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise RuntimeError(f"building the bench tokenizer failed:\n{done.stderr[-2000:]}")
    return out_dir


def bench_model_dir(path: Path, tokenizer_dir: Path) -> Path:
    """A folder shaped like a model (see harness.fake_model_dir) with a real small
    tokenizer: a create validates small files at once, with the base model's tokenizer."""
    fake_model_dir(path)
    for item in tokenizer_dir.iterdir():
        shutil.copy2(item, path / item.name)
    return path


def prepare_home(home: BenchHome, tokenizer_dir: Path) -> str:
    """migrate, a tenant with its quotas lifted and a base model; returns the tenant's API key."""
    home.cli("migrate")
    api_key = home.cli("tenants", "create", "bench").strip().splitlines()[-1].strip()
    # the load test creates thousands of jobs: neither the queued-jobs cap nor a GPU-hour cap may answer for it
    home.cli("tenants", "set-quota", "bench", "--max-queued-jobs", "unlimited", "--max-concurrent-jobs", "unlimited",
             "--gpu-hours-hard", "unlimited", "--gpu-hours-soft", "unlimited")
    print("tenant:    bench (standard tier), quotas lifted with `tuneforge tenants set-quota`: queued jobs, "
          "concurrent jobs and GPU-hours unlimited")
    home.cli("base-models", "add", BENCH_MODEL, str(bench_model_dir(home.root / "models" / BENCH_MODEL,
                                                                    tokenizer_dir)))
    return api_key


def create_job(client: httpx.Client, model: str, file_id: str) -> dict:
    response = client.post("/v1/fine_tuning/jobs", json={"model": model, "training_file": file_id})
    response.raise_for_status()
    return response.json()


def open_job_ids(client: httpx.Client) -> list[str]:
    ids, after = [], None
    for _ in range(MAX_LIST_PAGES):
        page = client.get("/v1/fine_tuning/jobs", params={"limit": 100, **({"after": after} if after else {})})
        page.raise_for_status()
        body = page.json()
        ids += [job["id"] for job in body["data"] if job["status"] not in ("succeeded", "failed", "cancelled")]
        if not body["has_more"]:
            break
        after = body["last_id"]
    return ids


async def _cancel(url: str, headers: dict[str, str], job_ids: list[str], deadline: float) -> Counter:
    outcomes: Counter = Counter()
    pending = iter(job_ids)
    async with httpx.AsyncClient(base_url=url, headers=headers, trust_env=False, timeout=REQUEST_TIMEOUT_S * 2,
                                 limits=httpx.Limits(max_connections=CANCEL_CLIENTS)) as client:
        async def worker() -> None:
            for job_id in pending:
                if time.monotonic() >= deadline:
                    outcomes["not sent (deadline)"] += 1
                    continue
                try:
                    outcomes[str((await client.post(f"/v1/fine_tuning/jobs/{job_id}/cancel")).status_code)] += 1
                except httpx.HTTPError as exc:
                    outcomes[type(exc).__name__] += 1

        await asyncio.gather(*(worker() for _ in range(CANCEL_CLIENTS)))
    return outcomes


def cancel_open_jobs(server: ServerProcess, headers: dict[str, str], keep: tuple[str, ...] = ()) -> str:
    """Cancel every job not yet finished but those in `keep`; says what happened."""
    started = time.monotonic()
    with local_client(server.url, headers=headers, timeout=REQUEST_TIMEOUT_S * 2) as client:
        job_ids = [job_id for job_id in open_job_ids(client) if job_id not in keep]
    outcomes = asyncio.run(_cancel(server.url, headers, job_ids, started + CANCEL_DEADLINE_S))
    failed = {k: v for k, v in outcomes.items() if k != "200"}
    return (f"cancelled {outcomes['200']} open jobs in {time.monotonic() - started:.1f}s"
            + (f" ({_errors_detail(Counter(failed))} failed)" if failed else ""))


# ---- the API phases ------------------------------------------------------------------
PHASE_NAMES = ("healthz", "get job", "list jobs", "get events", "create job")


def _phases(text: str) -> set[str]:
    return {"healthz", "get job", *_comma_list(text, str.strip, PHASE_NAMES)}


def phase_specs(job_id: str, file_id: str) -> list[tuple[str, RequestSpec]]:
    return [
        ("healthz", RequestSpec("GET", "/healthz")),
        ("get job", RequestSpec("GET", f"/v1/fine_tuning/jobs/{job_id}")),
        ("list jobs", RequestSpec("GET", "/v1/fine_tuning/jobs", params={"limit": 20})),
        ("get events", RequestSpec("GET", f"/v1/fine_tuning/jobs/{job_id}/events", params={"limit": 20})),
        ("create job", RequestSpec("POST", "/v1/fine_tuning/jobs",
                                   body={"model": BENCH_MODEL, "training_file": file_id})),
    ]


def seed_jobs(server: ServerProcess, headers: dict[str, str]) -> tuple[str, str]:
    """The training file and SEED_JOBS jobs; all but the first (the one read back) are cancelled."""
    with local_client(server.url, headers=headers, timeout=REQUEST_TIMEOUT_S * 2) as client:
        file_id = upload_training_file(client)
        jobs = [create_job(client, BENCH_MODEL, file_id) for _ in range(SEED_JOBS)]
    job = jobs[0]
    print(f"jobs:      {SEED_JOBS} created (the first's status: {job['status']}); "
          f"{cancel_open_jobs(server, headers, keep=(job['id'],))}; {job['id']} is read back", flush=True)
    if job["status"] not in ("queued", "validating_files"):
        print(f"  ! the job read back is {job['status']}: GET job measures a finished job", flush=True)
    return job["id"], file_id


def api_phases(server: ServerProcess, api_key: str, combo: Combination, args: argparse.Namespace) -> None:
    headers = {"Authorization": f"Bearer {api_key}"}
    job_id, file_id = seed_jobs(server, headers)
    processes = max(1, args.generator_processes)
    for clients, requests in ((args.clients, args.requests), (1, args.serial_requests)):
        if requests <= 0:
            continue
        generator = ("this process" if min(processes, clients) == 1
                     else f"{min(processes, clients)} forked processes")
        print(f"\n== {combo.description}: {requests} requests per phase over {clients} keep-alive client(s), "
              f"after {args.warmup} warm-up requests; load generator: {generator} ==", flush=True)
        results = []
        for name, spec in phase_specs(job_id, file_id):
            if args.phases is not None and name not in args.phases:
                continue
            profile_path = None
            if args.py_spy_dir:
                profile_path = (Path(args.py_spy_dir)
                                / f"{combo.database}-w{combo.workers}-{name.replace(' ', '-')}-c{clients}.folded")
            result = run_phase(server, name, spec, clients=clients, requests=requests, warmup=args.warmup,
                               headers=headers, timeout_s=args.phase_timeout_s, generator_processes=processes,
                               profile_path=profile_path, client=args.client)
            results.append(result)
            print(f"  {name}: p50 {_f(result.ms(50))} ms, p99 {_f(result.ms(99))} ms, {_f(result.throughput, 0)} "
                  f"req/s, {result.failed} failed", flush=True)
            if result.failed_by_kind().keys() & {"timeout", "cut"}:
                # requests the client gave up on may still hold the server's threads: let them end first
                print(f"  waiting {DRAIN_S:.0f}s for the server to finish the requests given up on", flush=True)
                time.sleep(DRAIN_S)
            if name == "create job":
                print(f"  {cancel_open_jobs(server, headers, keep=(job_id,))} (made by the create phase)",
                      flush=True)
        print()
        print_table(results)
        if clients == args.clients:
            combo.concurrent = results
            combo.goal = goal(results)
            print(f"\n{combo.goal.line}", flush=True)
        else:
            combo.serial = results
    if combo.workers > 1 and combo.concurrent and max(r.server_processes for r in combo.concurrent) == 1:
        print(f"\n! TUNEFORGE_API_WORKERS={combo.workers}, but the server ran as one process: this server "
              f"ignores the setting, and these figures are those of one worker")


# ---- the matrix -----------------------------------------------------------------------
class PgServer:
    """The throwaway PostgreSQL of scripts/pg.sh on PORT: started (and later stopped)
    unless one of ours already runs there, which is used and left running."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.env = {**os.environ, "TUNEFORGE_PG_DIR": os.environ.get("TUNEFORGE_PG_DIR", "/tmp/tfbench-pg")}
        self.started_here = False

    def _pg(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run(["bash", str(REPO / "scripts" / "pg.sh"), *args, str(self.port)], env=self.env,
                              capture_output=True, text=True, timeout=CLI_TIMEOUT_S, stdin=subprocess.DEVNULL)
        if check and done.returncode != 0:
            raise RuntimeError(f"scripts/pg.sh {args[0]} {self.port} failed:\n{done.stderr[-2000:]}")
        return done

    def start(self) -> str:
        if self._pg("status", check=False).returncode == 0:
            print(f"postgres:  using the server already running on 127.0.0.1:{self.port} "
                  f"(TUNEFORGE_PG_DIR={self.env['TUNEFORGE_PG_DIR']}); it is left running")
        else:
            self.started_here = True
            self._pg("start")
            print(f"postgres:  started with scripts/pg.sh on 127.0.0.1:{self.port} "
                  f"(TUNEFORGE_PG_DIR={self.env['TUNEFORGE_PG_DIR']}); stopped at the end")
        return self._pg("url").stdout.strip()

    def stop(self) -> None:
        if self.started_here:
            self._pg("stop", check=False)
            self.started_here = False


def server_env(workers: int, args: argparse.Namespace) -> dict[str, str]:
    env = {"TUNEFORGE_API_WORKERS": str(workers)}
    if args.rate_limits:
        env["TUNEFORGE_RATE_LIMITS"] = args.rate_limits
    return env


def run_combination(combo: Combination, admin_url: str | None, tokenizer_dir: Path, args: argparse.Namespace,
                    trainer_phase: bool) -> None:
    with ExitStack() as stack:
        database_url = None
        if combo.database == "postgres":
            pg = PostgresDatabase(admin_url)
            stack.callback(pg.close)
            database_url = pg.url
            combo.description = f"PostgreSQL {pg.server_version}, {combo.workers} API worker(s)"
            database = f"PostgreSQL {pg.server_version} (fresh database {pg.name})"
        else:
            combo.description = f"SQLite, {combo.workers} API worker(s)"
            database = "SQLite (file in the temp home, WAL)"
        print(f"\n\n######## {combo.description} ########\n")
        print(f"database:  {database}")
        home = BenchHome(database_url, keep=args.keep_home)
        stack.callback(home.close)
        print(f"home:      {home.root}{' (kept)' if args.keep_home else ''}")
        api_key = prepare_home(home, tokenizer_dir)
        server = stack.enter_context(ServerProcess(home, scheduler=False,
                                                   extra_env=server_env(combo.workers, args)))
        print(f"server:    {server.command_line}  (pid {server.proc.pid}, {server.url}, "
              f"{server.process_count()} process(es) at start)", flush=True)
        api_phases(server, api_key, combo, args)
        print(f"\nload avg after the API phases: {load_average()}")
        if not trainer_phase:
            return
        headers = {"Authorization": f"Bearer {api_key}"}
        print(f"\n{cancel_open_jobs(server, headers)} before starting the scheduler")
        server.stop()

        from trainer_start import trainer_start_phase

        trainer_start_phase(home, api_key, args, stack)


def _comma_list(text: str, convert: Callable[[str], Any], allowed: tuple | None = None) -> list:
    values = [convert(part.strip()) for part in text.split(",") if part.strip()]
    if not values or (allowed is not None and any(v not in allowed for v in values)):
        raise argparse.ArgumentTypeError(f"{text!r}: a comma list{' of ' + ', '.join(allowed) if allowed else ''}")
    return values


def _workers(text: str) -> list[int]:
    values = _comma_list(text, int)
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: worker counts are >= 1")
    return values


def _rate_limits(text: str) -> str:
    if text:
        json.loads(text)  # a typo fails here, not silently in the server
    return text


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database", type=lambda t: _comma_list(t, str.lower, DATABASES), default=None,
                        help="Comma list of sqlite, postgres (default: sqlite,postgres; postgres alone when "
                             "--database-url is given).")
    parser.add_argument("--workers", type=_workers, default=[1, 2],
                        help="Comma list of API worker counts, each run as TUNEFORGE_API_WORKERS=N (default 1,2).")
    parser.add_argument("--database-url", default=None,
                        help="PostgreSQL server to use (postgresql+psycopg://...; a fresh database is created on it "
                             "per combination and dropped after). Default: start one with scripts/pg.sh.")
    parser.add_argument("--pg-port", type=int, default=54339,
                        help="Port of the scripts/pg.sh server when no --database-url is given.")
    parser.add_argument("--rate-limits", type=_rate_limits, default=NO_RATE_LIMITS,
                        help="JSON given to the server as TUNEFORGE_RATE_LIMITS (default: no limit for any tier; "
                             "'' leaves the variable unset, i.e. the server's own default).")
    parser.add_argument("--phases", type=_phases, default=None,
                        help=f"Comma list of the phases to run, of {', '.join(PHASE_NAMES)} (default: all); "
                             "healthz and get job, which the goal compares, always run.")
    parser.add_argument("--quick", action="store_true",
                        help=f"Smoke run: defaults become {QUICK} instead of {FULL}.")
    parser.add_argument("--clients", type=int, default=GOAL_CLIENTS, help="Concurrent keep-alive clients.")
    parser.add_argument("--requests", type=int, default=None, help="Measured requests per phase.")
    parser.add_argument("--warmup", type=int, default=None, help="Unmeasured requests before each phase.")
    parser.add_argument("--serial-requests", type=int, default=None,
                        help="Measured requests per phase of the one-client pass (0 skips it).")
    parser.add_argument("--phase-timeout-s", type=float, default=None,
                        help="Deadline of one phase, warm-up included.")
    parser.add_argument("--client", choices=CLIENTS, default="raw",
                        help="The load generator's HTTP client: raw (HTTP/1.1 over asyncio streams, a fraction of "
                             "httpx's CPU per request: the server keeps the cores) or httpx (what the openai SDK "
                             "uses).")
    parser.add_argument("--generator-processes", type=int, default=1,
                        help="Split the clients over K forked load generator processes (default 1: all of them "
                             "in this process).")
    parser.add_argument("--trainer-jobs", type=int, default=0,
                        help="Jobs of the submit-to-trainer-start phase, one after the other, run once after the "
                             "first combination (default 0: skipped; it takes minutes).")
    parser.add_argument("--trainer-timeout-s", type=float, default=300.0,
                        help="Longest wait for one job's first trainer report.")
    parser.add_argument("--py-spy-dir", default=None,
                        help="Sample the server (and its workers) with py-spy during each measured phase and write "
                             "folded stacks here (needs py-spy on PATH; sampling costs the server some CPU: figures "
                             "of such a run are for finding where the time goes, not for the table).")
    parser.add_argument("--keep-home", action="store_true", help="Keep the temp homes (logs) for inspection.")
    args = parser.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.database is None:
        args.database = ["postgres"] if args.database_url else list(DATABASES)
    return args


def _stop_on_signals() -> None:
    """SIGTERM and SIGINT stop the run through the same cleanup as Ctrl-C, also when
    SIGINT was ignored at start (a background job of a non-interactive shell)."""
    def handler(_signum, _frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def prerequisites(args: argparse.Namespace, stack: ExitStack) -> tuple[str | None, Path]:
    """The PostgreSQL admin URL when a combination needs one (a server started here, stopped by
    `stack`, unless --database-url names one) and the bench model's tokenizer folder."""
    admin_url = args.database_url
    if "postgres" in args.database and admin_url is None:
        pg_server = PgServer(args.pg_port)
        stack.callback(pg_server.stop)
        admin_url = pg_server.start()
    scratch = Path(tempfile.mkdtemp(prefix="tuneforge-bench-tokenizer-"))
    stack.callback(shutil.rmtree, scratch, True)
    tokenizer_env = {k: v for k, v in os.environ.items() if not k.startswith("TUNEFORGE_")}
    return admin_url, build_tokenizer_dir(tokenizer_env, scratch / "tokenizer")


def run(args: argparse.Namespace, stack: ExitStack) -> list[Combination]:
    databases = "; ".join("SQLite (file in each temp home, WAL)" if d == "sqlite" else
                          "PostgreSQL (a fresh database per combination)" for d in args.database)
    print("\n".join(machine_lines(databases)), flush=True)
    print(f"matrix:    database {', '.join(args.database)} x API workers {', '.join(map(str, args.workers))}; "
          f"{args.clients} clients, {args.requests} requests per phase (+{args.warmup} warm-up), one-client pass "
          f"{args.serial_requests}; phase deadline {args.phase_timeout_s:.0f}s{'; --quick' if args.quick else ''}")
    print(f"generator: asyncio + {'raw HTTP/1.1 over streams' if args.client == 'raw' else 'httpx'}, one keep-alive "
          f"connection per client, "
          f"{'in this process' if args.generator_processes <= 1 else f'{args.generator_processes} forked processes'}")
    print(f"server env: TUNEFORGE_API_WORKERS=N, "
          f"{'TUNEFORGE_RATE_LIMITS=' + args.rate_limits if args.rate_limits else 'TUNEFORGE_RATE_LIMITS unset'}")
    admin_url, tokenizer_dir = prerequisites(args, stack)

    combinations = [Combination(database, workers) for database in args.database for workers in args.workers]
    for number, combo in enumerate(combinations):
        try:
            run_combination(combo, admin_url, tokenizer_dir, args, trainer_phase=number == 0 and args.trainer_jobs > 0)
        except (RuntimeError, OSError, httpx.HTTPError, subprocess.SubprocessError) as exc:
            combo.error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            print(f"\n! {combo.database}, {combo.workers} worker(s) failed: {exc}", flush=True)
    print_summary(combinations, args.clients)
    return combinations


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.py_spy_dir and shutil.which("py-spy") is None:
        print("--py-spy-dir needs py-spy on PATH (pip install py-spy)", file=sys.stderr)
        return 2
    _stop_on_signals()
    try:
        with ExitStack() as stack:
            combinations = run(args, stack)
    except KeyboardInterrupt:
        print("\ninterrupted: everything started here was stopped", file=sys.stderr)
        return 130
    return 1 if any(combo.error for combo in combinations) else 0


if __name__ == "__main__":
    sys.exit(main())
