"""API latency of the control plane, and submit-to-trainer-start latency.

    python benchmarks/api_latency.py [--clients 50] [--requests 2000] [--database-url URL]

    # on PostgreSQL: a throwaway server (its own port, so the test suite's is left alone)
    TUNEFORGE_PG_DIR=/tmp/tfbench-pg bash scripts/pg.sh start 54339
    python benchmarks/api_latency.py --database-url "$(bash scripts/pg.sh url 54339)"
    TUNEFORGE_PG_DIR=/tmp/tfbench-pg bash scripts/pg.sh stop 54339

Builds a fresh TUNEFORGE_HOME through the real CLI (migrate, a tenant, a base
model), starts `tuneforge serve` as a separate process on 127.0.0.1 and drives
it with N concurrent keep-alive clients (asyncio + httpx, one connection each)
from this process:

  baseline      GET  /healthz                      the FastAPI + uvicorn floor of the same process
  job retrieve  GET  /v1/fine_tuning/jobs/{id}     API key lookup + one job row
  job create    POST /v1/fine_tuning/jobs          API key lookup, checks, an insert and an event

Each phase has a warm-up on the same connections, then the measured requests;
the figures are latency percentiles, throughput and the CPU seconds spent by
the server and by this load generator (they share the machine's cores). A
one-client pass then gives the latency of the same requests without queueing.

Then the control plane is restarted with its scheduler and a real tiny model is
fine-tuned N times in a row to time submit -> `running` -> first trainer report
(see benchmarks/trainer_start.py).

Every loop is bounded by a count and a deadline; every process started here is
stopped on exit, errors and Ctrl-C included. Traffic goes to 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import shutil
import signal
import sys
import time
from collections import Counter
from contextlib import AsyncExitStack, ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Awaitable, Callable

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import (  # noqa: E402 - benchmarks/ is not a package
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

BENCH_MODEL = "bench-fake"
REQUEST_TIMEOUT_S = 30.0
MAX_LIST_PAGES = 1000
OTHER_CORES_WARNING = 0.25

RequestFn = Callable[[httpx.AsyncClient], Awaitable[httpx.Response]]


# ---- statistics ---------------------------------------------------------------
def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (q in 0..100)."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


@dataclass
class PhaseResult:
    name: str
    request: str
    clients: int
    latencies_s: list[float] = field(default_factory=list)
    errors: Counter = field(default_factory=Counter)
    wall_s: float = 0.0
    server_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    machine_cpu_s: float = 0.0  # every process on the machine, these two included
    stolen_cpu_s: float = 0.0  # the hypervisor gave our cores to someone else

    def ms(self, q: float) -> float:
        return percentile(sorted(self.latencies_s), q) * 1000

    @property
    def max_ms(self) -> float:
        return max(self.latencies_s, default=math.nan) * 1000

    @property
    def throughput(self) -> float:
        return len(self.latencies_s) / self.wall_s if self.wall_s else math.nan

    @property
    def other_cores(self) -> float:
        """Cores kept busy by everything but the server and this client (the database server, other work)."""
        return (self.machine_cpu_s - self.server_cpu_s - self.client_cpu_s) / self.wall_s if self.wall_s else math.nan

    def cpu_ms_per_request(self, cpu_s: float) -> float:
        done = len(self.latencies_s) + sum(self.errors.values())
        return cpu_s / done * 1000 if done else math.nan


# ---- the load generator ------------------------------------------------------
async def _drive(pool: list[httpx.AsyncClient], request: RequestFn, total: int, deadline: float,
                 result: PhaseResult | None) -> None:
    """Send `total` requests over the pool, one in flight per client, until done or the deadline."""
    counter = itertools.count()

    async def worker(client: httpx.AsyncClient) -> None:
        while next(counter) < total and time.monotonic() < deadline:
            started = time.perf_counter()
            try:
                response = await request(client)
                outcome = response.status_code
            except httpx.HTTPError as exc:
                outcome = type(exc).__name__
            elapsed = time.perf_counter() - started
            if result is None:
                continue
            if outcome == 200:
                result.latencies_s.append(elapsed)
            else:
                result.errors[str(outcome)] += 1

    await asyncio.gather(*(worker(client) for client in pool))


async def run_phase(server: ServerProcess, name: str, label: str, request: RequestFn, *, clients: int,
                    requests: int, warmup: int, headers: dict[str, str], timeout_s: float,
                    profile_path: Path | None = None) -> PhaseResult:
    result = PhaseResult(name, label, clients)
    deadline = time.monotonic() + timeout_s
    async with AsyncExitStack() as stack:
        pool = [
            await stack.enter_async_context(httpx.AsyncClient(
                base_url=server.url, headers=headers, timeout=REQUEST_TIMEOUT_S, trust_env=False,
                limits=httpx.Limits(max_connections=1, max_keepalive_connections=1)))
            for _ in range(clients)
        ]
        await _drive(pool, request, warmup, deadline, None)
        with ExitStack() as profiling:
            if profile_path is not None:
                profiling.enter_context(PySpy(server.proc.pid, profile_path, deadline - time.monotonic()))
            server_cpu, client_cpu = server.cpu_s(), time.process_time()
            machine_cpu, stolen_cpu = read_machine_cpu_s()
            started = time.perf_counter()
            await _drive(pool, request, requests, deadline, result)
            result.wall_s = time.perf_counter() - started
            result.server_cpu_s = server.cpu_s() - server_cpu
            result.client_cpu_s = time.process_time() - client_cpu
            machine_now, stolen_now = read_machine_cpu_s()
            result.machine_cpu_s, result.stolen_cpu_s = machine_now - machine_cpu, stolen_now - stolen_cpu
    if len(result.latencies_s) + sum(result.errors.values()) < requests:
        print(f"  ! {name}: stopped at the {timeout_s:.0f}s deadline", flush=True)
    return result


# ---- reporting -------------------------------------------------------------------
def print_table(results: list[PhaseResult]) -> None:
    print("| phase | request | clients | ok | errors | p50 ms | p90 ms | p99 ms | max ms | req/s "
          "| server CPU ms/req | client CPU ms/req | server cores | other cores |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        errors = ", ".join(f"{k}x{v}" for k, v in r.errors.items()) or "0"
        print(f"| {r.name} | `{r.request}` | {r.clients} | {len(r.latencies_s)} | {errors} | {r.ms(50):.2f} "
              f"| {r.ms(90):.2f} | {r.ms(99):.2f} | {r.max_ms:.2f} | {r.throughput:.0f} "
              f"| {r.cpu_ms_per_request(r.server_cpu_s):.2f} | {r.cpu_ms_per_request(r.client_cpu_s):.2f} "
              f"| {r.server_cpu_s / r.wall_s:.2f} | {r.other_cores:.2f} |")
    busy = [f"{r.name} ({r.other_cores:.2f})" for r in results if r.other_cores > OTHER_CORES_WARNING]
    if busy:
        print(f"! other processes kept cores busy during: {', '.join(busy)}; with a database server on this "
              f"machine that is expected, otherwise these figures are skewed by other work")
    stolen = [f"{r.name} ({r.stolen_cpu_s / r.wall_s:.2f})" for r in results
              if r.wall_s and r.stolen_cpu_s / r.wall_s > OTHER_CORES_WARNING]
    if stolen:
        print(f"! the hypervisor took cores away (stolen cores) during: {', '.join(stolen)}")


def print_ratios(results: list[PhaseResult]) -> None:
    base = results[0]
    print(f"\nratio to the baseline ({base.name}, {base.clients} client(s)):")
    print("| phase | p50 / baseline p50 | p99 / baseline p99 | req/s / baseline req/s |")
    print("|---|---:|---:|---:|")
    for r in results:
        print(f"| {r.name} | {r.ms(50) / base.ms(50):.2f}x | {r.ms(99) / base.ms(99):.2f}x "
              f"| {r.throughput / base.throughput:.2f}x |")


# ---- setup through the CLI and the API ----------------------------------------
def prepare_home(home: BenchHome) -> str:
    """migrate, a tenant and a fake base model; returns the tenant's API key."""
    home.cli("migrate")
    api_key = home.cli("tenants", "create", "bench").strip().splitlines()[-1].strip()
    # the load test creates thousands of jobs: lift the tier's queued-jobs limit
    home.cli("tenants", "set-quota", "bench", "--max-queued-jobs", "unlimited")
    home.cli("base-models", "add", BENCH_MODEL, str(fake_model_dir(home.root / "models" / BENCH_MODEL)))
    return api_key


def create_job(client: httpx.Client, model: str, file_id: str) -> dict:
    response = client.post("/v1/fine_tuning/jobs", json={"model": model, "training_file": file_id})
    response.raise_for_status()
    return response.json()


def cancel_open_jobs(client: httpx.Client) -> int:
    """Cancel every job not yet finished, so a scheduler started later ignores them."""
    open_ids, after = [], None
    for _ in range(MAX_LIST_PAGES):
        page = client.get("/v1/fine_tuning/jobs", params={"limit": 100, **({"after": after} if after else {})})
        page.raise_for_status()
        body = page.json()
        open_ids += [job["id"] for job in body["data"] if job["status"] not in ("succeeded", "failed", "cancelled")]
        if not body["has_more"]:
            break
        after = body["last_id"]
    for job_id in open_ids:
        client.post(f"/v1/fine_tuning/jobs/{job_id}/cancel").raise_for_status()
    return len(open_ids)


# ---- the API phases ------------------------------------------------------------------
def api_phases(server: ServerProcess, api_key: str, args: argparse.Namespace) -> list[list[PhaseResult]]:
    headers = {"Authorization": f"Bearer {api_key}"}
    with local_client(server.url, headers=headers) as client:
        file_id = upload_training_file(client)
        job_id = create_job(client, BENCH_MODEL, file_id)["id"]
    create_body = {"model": BENCH_MODEL, "training_file": file_id}
    phases: list[tuple[str, str, RequestFn]] = [
        ("baseline", "GET /healthz", lambda c: c.get("/healthz")),
        ("job retrieve", "GET /v1/fine_tuning/jobs/{id}", lambda c: c.get(f"/v1/fine_tuning/jobs/{job_id}")),
        ("job create", "POST /v1/fine_tuning/jobs", lambda c: c.post("/v1/fine_tuning/jobs", json=create_body)),
    ]
    tables = []
    for clients, requests in ((args.clients, args.requests), (1, args.serial_requests)):
        if requests <= 0:
            continue
        print(f"\n== {requests} requests per phase over {clients} keep-alive client(s), "
              f"after {args.warmup} warm-up requests ==", flush=True)
        results = []
        for name, label, request in phases:
            profile_path = None
            if args.py_spy_dir:
                profile_path = Path(args.py_spy_dir) / f"{name.replace(' ', '-')}-c{clients}.folded"
            result = asyncio.run(run_phase(server, name, label, request, clients=clients, requests=requests,
                                           warmup=args.warmup, headers=headers, timeout_s=args.phase_timeout_s,
                                           profile_path=profile_path))
            results.append(result)
            print(f"  {name}: p50 {result.ms(50):.2f} ms, {result.throughput:.0f} req/s", flush=True)
        print()
        print_table(results)
        print_ratios(results)
        tables.append(results)
    return tables


# ---- main -----------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=50, help="Concurrent keep-alive clients.")
    parser.add_argument("--requests", type=int, default=2000, help="Measured requests per phase.")
    parser.add_argument("--warmup", type=int, default=200, help="Unmeasured requests before each phase.")
    parser.add_argument("--serial-requests", type=int, default=300,
                        help="Measured requests per phase of the one-client pass (0 skips it).")
    parser.add_argument("--phase-timeout-s", type=float, default=600.0, help="Deadline of one phase.")
    parser.add_argument("--database-url", default=None,
                        help="PostgreSQL server (postgresql+psycopg://...): a fresh database is created "
                             "on it and dropped at the end. Default: SQLite in the temp home.")
    parser.add_argument("--trainer-jobs", type=int, default=3,
                        help="Jobs of the submit-to-trainer-start phase, one after the other (0 skips it).")
    parser.add_argument("--trainer-timeout-s", type=float, default=300.0,
                        help="Longest wait for one job's first trainer report.")
    parser.add_argument("--py-spy-dir", default=None,
                        help="Sample the server with py-spy during each measured phase and write folded stacks "
                             "here (needs py-spy on PATH; sampling costs the server some CPU: figures of such a "
                             "run are for finding where the time goes, not for the table).")
    parser.add_argument("--keep-home", action="store_true", help="Keep the temp home (logs) for inspection.")
    return parser.parse_args(argv)


def _stop_on_sigterm() -> None:
    def handler(_signum, _frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def run(args: argparse.Namespace, stack: ExitStack) -> None:
    database = "SQLite (file in the temp home, WAL)"
    database_url = None
    if args.database_url:
        pg = PostgresDatabase(args.database_url)
        stack.callback(pg.close)
        database_url = pg.url
        database = f"PostgreSQL {pg.server_version} (fresh database {pg.name})"
    print("\n".join(machine_lines(database)), flush=True)
    home = BenchHome(database_url, keep=args.keep_home)
    stack.callback(home.close)
    print(f"home:      {home.root}{' (kept)' if args.keep_home else ''}")
    api_key = prepare_home(home)

    server = stack.enter_context(ServerProcess(home, scheduler=False))
    print(f"server:    {server.command_line}  (pid {server.proc.pid}, {server.url})", flush=True)
    api_phases(server, api_key, args)
    print(f"\nload avg after the API phases: {load_average()}")
    if args.trainer_jobs <= 0:
        return
    with local_client(server.url, headers={"Authorization": f"Bearer {api_key}"}) as client:
        print(f"\ncancelled {cancel_open_jobs(client)} open benchmark jobs before starting the scheduler")
    server.stop()

    from trainer_start import trainer_start_phase

    trainer_start_phase(home, api_key, args, stack)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.py_spy_dir and shutil.which("py-spy") is None:
        print("--py-spy-dir needs py-spy on PATH (pip install py-spy)", file=sys.stderr)
        return 2
    _stop_on_sigterm()
    try:
        with ExitStack() as stack:
            run(args, stack)
    except KeyboardInterrupt:
        print("\ninterrupted: everything started here was stopped", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
