"""One tenant floods the API; does another tenant's latency stay within the goal?

    python benchmarks/api_isolation.py [--database sqlite,postgres] [--workers 1,2] [--quick]

Goal (issue: the control plane under load): a flood from one tenant must not
raise another tenant's GET job p99 above 200 ms on this machine, with the load
generators beside the server. Printed as a PASS/FAIL line, never asserted.

Per (database, API workers) combination: a fresh home built through the real
CLI, `tuneforge serve --no-scheduler` as a separate process with the
platform's default rate limits for the free and premium tiers and none for
the standard tier (TUNEFORGE_RATE_LIMITS='{"standard": null}'), and two
tenants, quotas lifted:

  quiet   premium tier (500 requests/s, 256 in flight): --quiet-clients
          keep-alive clients read one of its jobs back at --quiet-rate
          requests/s in all, each client on a fixed schedule; a request's
          latency counts from when it was due, not from when it was sent, so
          that a late answer, which delays its client's next request, is not
          hidden (coordinated omission). Its connections are opened and used
          once before the flood starts, as a polling client keeps its own.
  flood   free tier (20 requests/s, 16 in flight): --flood-clients clients
          in a forked process send GET job as fast as the answers come (closed
          loop), from a second before the quiet tenant starts until after it
          stops

Phases, each --phase-s long:

  quiet alone          the quiet tenant by itself: its latency without a neighbour
  flood, limited       the flood on the free tier: most of it answered 429
  flood, unlimited     the baseline: the same flood after `tuneforge tenants
                       set-tier flood standard` (no limits; the API's key
                       cache takes a tier change within a second)

Per phase: the quiet tenant's p50/p95/p99/max and failures, the flood's
answers by status and its rate, CPU of the server's process tree and of the
machine (and what the hypervisor took: "stolen"). After the
limited flood, one flood request is checked for what the openai SDK needs to
back off: status 429, a Retry-After header and OpenAI's `rate_limit_exceeded`
code.

Traffic goes to 127.0.0.1 only; every loop is bounded by its phase's deadline;
servers, generator processes and a PostgreSQL server the script started are
stopped on exit, on errors and on Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import multiprocessing
import queue
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from api_latency import (  # noqa: E402 - benchmarks/ is not a package
    DATABASES,
    REQUEST_TIMEOUT_S,
    RawConnection,
    RequestSpec,
    RequestTimeout,
    _comma_list,
    _drive,
    _f,
    _workers,
    bench_model_dir,
    cancel_open_jobs,
    create_job,
    percentile,
    prerequisites,
)
from harness import (  # noqa: E402
    BenchHome,
    PostgresDatabase,
    ServerProcess,
    load_average,
    local_client,
    machine_lines,
    read_machine_cpu_s,
    upload_training_file,
)

GOAL_P99_MS = 200.0
RATE_LIMITS = '{"standard": null}'  # free and premium keep the platform's defaults
QUIET_TIER, FLOOD_TIER, UNLIMITED_TIER = "premium", "free", "standard"
BENCH_MODEL = "bench-fake"
FLOOD_LEAD_S = 1.0  # the flood runs this long before the quiet tenant's measured part, and after it
TIER_SETTLE_S = 2.5  # the key cache re-reads a tenant within 1 s
QUICK = {"phase_s": 10.0}
FULL = {"phase_s": 30.0}


@dataclass
class QuietRun:
    latencies_s: list[float] = field(default_factory=list)
    errors: Counter = field(default_factory=Counter)
    wall_s: float = 0.0
    lateness_s: list[float] = field(default_factory=list)
    timeline: list = field(default_factory=list)  # sent after it was due (this generator's own delay)

    def ms(self, q: float) -> float:
        return percentile(sorted(self.latencies_s), q) * 1000


@dataclass
class FloodRun:
    ok: int = 0
    outcomes: Counter = field(default_factory=Counter)  # status (or error kind) -> count, 200s excluded
    wall_s: float = 0.0

    @property
    def sent(self) -> int:
        return self.ok + sum(self.outcomes.values())


@dataclass
class PhaseResult:
    name: str
    quiet: QuietRun
    flood: FloodRun | None
    server_cpu_s: float
    wall_s: float
    machine_cpu_s: float  # every process on the machine, the server and both generators included
    stolen_cpu_s: float  # the hypervisor ran something else on our virtual cores

    @property
    def requests(self) -> int:
        """Requests answered while the server's CPU was measured, both tenants': the flood's at its
        average rate (it ran FLOOD_LEAD_S longer at each end)."""
        quiet = len(self.quiet.latencies_s) + sum(self.quiet.errors.values())
        flood = self.flood.sent / self.flood.wall_s * self.wall_s if self.flood is not None else 0.0
        return round(quiet + flood)


# ---- the quiet tenant: open loop ---------------------------------------------------
async def paced(url: str, headers: dict[str, str], spec: RequestSpec, clients: int, rate_per_s: float,
                duration_s: float, before: Callable[[], None]) -> QuietRun:
    """`clients` connections, each sending on its own fixed schedule so that all of them together send
    `rate_per_s`; a request's latency counts from when it was due, not from when it was sent. Each
    connection is opened and used once first (a polling client keeps its connection), then
    `before()` runs (it starts the flood), then the measured part."""
    run = QuietRun()
    interval_s = clients / rate_per_s
    pool = [RawConnection(url, headers, spec) for _ in range(clients)]
    for connection in pool:
        await connection.send(REQUEST_TIMEOUT_S)
    before()
    start = time.monotonic() + 0.05
    end = start + duration_s

    async def client(index: int, connection: RawConnection) -> None:
        due = start + index * interval_s / clients
        while due < end:
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            run.lateness_s.append(time.monotonic() - due)
            try:
                outcome = str(await connection.send(REQUEST_TIMEOUT_S))
            except RequestTimeout:
                outcome = "timeout"
            except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                outcome = type(exc).__name__
            if outcome == "200":
                run.latencies_s.append(time.monotonic() - due)
            else:
                run.errors[outcome] += 1
            due += interval_s  # a client that fell behind sends at once until it is on time again

    try:
        await asyncio.gather(*(client(i, c) for i, c in enumerate(pool)))
    finally:
        for connection in pool:
            connection.close()
    run.wall_s = time.monotonic() - start
    return run


# ---- the flood: closed loop in a forked process ------------------------------------
def _flood_child(url: str, headers: dict[str, str], spec: RequestSpec, clients: int, duration_s: float,
                 out: multiprocessing.Queue) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)

    async def flood() -> FloodRun:
        run = FloodRun()
        pool = [RawConnection(url, headers, spec) for _ in range(clients)]
        latencies: list[float] = []
        started = time.monotonic()
        try:
            await _drive(pool, 10**9, started + duration_s, latencies, run.outcomes)
        finally:
            for connection in pool:
                connection.close()
        run.wall_s = time.monotonic() - started
        run.ok = len(latencies)
        run.outcomes.pop("cut at deadline", None)  # the requests in flight when the flood was told to stop
        return run

    try:
        out.put(("result", asyncio.run(flood())))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises
        out.put(("failed", repr(exc)))


class Flood:
    """The flood tenant's generator process for the duration of a `with` block (and FLOOD_LEAD_S around it)."""

    def __init__(self, url: str, headers: dict[str, str], spec: RequestSpec, clients: int, duration_s: float) -> None:
        context = multiprocessing.get_context("fork")
        self.out = context.Queue()
        self.duration_s = duration_s + 2 * FLOOD_LEAD_S
        self.child = context.Process(target=_flood_child, name="tfbench-flood", daemon=True,
                                     args=(url, headers, spec, clients, self.duration_s, self.out))
        self.result: FloodRun | None = None

    def __enter__(self) -> Flood:
        self.child.start()
        time.sleep(FLOOD_LEAD_S)
        return self

    def __exit__(self, *_exc) -> None:
        try:
            message = self.out.get(timeout=self.duration_s + REQUEST_TIMEOUT_S)
            if message[0] == "failed":
                raise RuntimeError(f"the flood generator failed: {message[1]}")
            self.result = message[1]
        except queue.Empty:
            raise RuntimeError("the flood generator did not report in time") from None
        finally:
            self.child.join(5.0)
            if self.child.is_alive():
                self.child.kill()
                self.child.join(5.0)
            self.out.close()
            self.out.join_thread()


# ---- phases ---------------------------------------------------------------------------
@dataclass
class Tenants:
    quiet_headers: dict[str, str]
    flood_headers: dict[str, str]
    quiet_spec: RequestSpec
    flood_spec: RequestSpec


def run_phase(name: str, server: ServerProcess, tenants: Tenants, args: argparse.Namespace,
              flood: bool) -> PhaseResult:
    with ExitStack() as stack:
        flood_process = None
        readings: dict[str, float] = {}

        def before() -> None:
            """Start the flood (FLOOD_LEAD_S ahead), then take the CPU readings."""
            nonlocal flood_process
            if flood:
                flood_process = stack.enter_context(Flood(server.url, tenants.flood_headers, tenants.flood_spec,
                                                          args.flood_clients, args.phase_s))
            readings["server"] = server.tree_cpu_s()
            readings["machine"], readings["stolen"] = read_machine_cpu_s()
            readings["started"] = time.monotonic()

        quiet = asyncio.run(paced(server.url, tenants.quiet_headers, tenants.quiet_spec, args.quiet_clients,
                                  args.quiet_rate, args.phase_s, before))
        wall_s = time.monotonic() - readings["started"]
        server_cpu_s = server.tree_cpu_s() - readings["server"]
        machine_after, stolen_after = read_machine_cpu_s()
    result = PhaseResult(name, quiet, flood_process.result if flood_process else None, server_cpu_s, wall_s,
                         machine_after - readings["machine"], stolen_after - readings["stolen"])
    flood_text = ""
    if result.flood is not None:
        f = result.flood
        flood_text = (f"; flood: {f.sent / f.wall_s:.0f} req/s sent, {f.ok} answered 200, "
                      f"{f.outcomes.get('429', 0)} answered 429, other: {dict(f.outcomes - Counter({'429': 0}))}")
    print(f"  {name}: quiet p50 {_f(quiet.ms(50))} ms, p99 {_f(quiet.ms(99))} ms, {len(quiet.latencies_s)} ok, "
          f"sent late by p99 {_f(percentile(sorted(quiet.lateness_s), 99) * 1000)} ms, "
          f"{sum(quiet.errors.values())} failed{flood_text}", flush=True)
    return result


def check_retry_after(server: ServerProcess, tenants: Tenants) -> str:
    """Drive the flood tenant over its limit once more and describe one 429 as the SDK sees it."""
    with local_client(server.url, headers=tenants.flood_headers, timeout=REQUEST_TIMEOUT_S) as client:
        for _ in range(200):
            response = client.get(tenants.flood_spec.path)
            if response.status_code == 429:
                error = response.json().get("error", {})
                return (f"429, Retry-After: {response.headers.get('retry-after', 'MISSING')}, type "
                        f"{error.get('type')!r}, code {error.get('code')!r}")
    return "no 429 in 200 requests: the flood tenant was not limited"


def print_table(results: list[PhaseResult]) -> None:
    print("\n| phase | quiet ok | quiet failed | quiet p50 ms | p95 ms | p99 ms | max ms | flood req/s sent "
          "| flood 200 | flood 429 | flood other | server CPU ms/req | server cores | machine busy cores "
          "| stolen cores |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        q, f = r.quiet, r.flood
        flood_cells = "- | - | - | -"
        if f is not None:
            other = sum(v for k, v in f.outcomes.items() if k != "429")
            flood_cells = f"{f.sent / f.wall_s:.0f} | {f.ok} | {f.outcomes.get('429', 0)} | {other}"
        print(f"| {r.name} | {len(q.latencies_s)} | {sum(q.errors.values())} | {_f(q.ms(50))} | {_f(q.ms(95))} "
              f"| {_f(q.ms(99))} | {_f(max(q.latencies_s, default=math.nan) * 1000)} | {flood_cells} "
              f"| {_f(r.server_cpu_s * 1000 / r.requests, 3)} "
              f"| {_f(r.server_cpu_s / r.wall_s)} | {_f(r.machine_cpu_s / r.wall_s)} "
              f"| {_f(r.stolen_cpu_s / r.wall_s)} |")
    for r in results:
        if r.quiet.errors:
            print(f"  {r.name}: quiet tenant's failures: {dict(r.quiet.errors)}")


def goal_line(limited: PhaseResult) -> tuple[bool, str]:
    p99 = limited.quiet.ms(99)
    failed = sum(limited.quiet.errors.values())
    passed = p99 <= GOAL_P99_MS and failed == 0
    return passed, (f"GOAL {'PASS' if passed else 'FAIL'}: the quiet tenant's GET job p99 under the limited flood "
                    f"{_f(p99, 1)} ms (<= {GOAL_P99_MS:.0f}), {failed} failed (0)")


# ---- setup and the matrix -------------------------------------------------------------
def make_tenant(home: BenchHome, name: str, tier: str) -> str:
    api_key = home.cli("tenants", "create", name, "--tier", tier).strip().splitlines()[-1].strip()
    home.cli("tenants", "set-quota", name, "--max-queued-jobs", "unlimited", "--gpu-hours-hard", "unlimited")
    return api_key


def seed_job(server: ServerProcess, headers: dict[str, str]) -> str:
    with local_client(server.url, headers=headers, timeout=REQUEST_TIMEOUT_S * 2) as client:
        file_id = upload_training_file(client)
        return create_job(client, BENCH_MODEL, file_id)["id"]


def run_combination(database: str, workers: int, admin_url: str | None, tokenizer_dir: Path,
                    args: argparse.Namespace) -> tuple[bool, str]:
    with ExitStack() as stack:
        database_url = None
        if database == "postgres":
            pg = PostgresDatabase(admin_url)
            stack.callback(pg.close)
            database_url = pg.url
            label = f"PostgreSQL {pg.server_version}, {workers} API worker(s)"
        else:
            label = f"SQLite, {workers} API worker(s)"
        print(f"\n\n######## {label} ########\n")
        home = BenchHome(database_url)
        stack.callback(home.close)
        home.cli("migrate")
        quiet_key = make_tenant(home, "quiet", QUIET_TIER)
        flood_key = make_tenant(home, "flood", FLOOD_TIER)
        home.cli("base-models", "add", BENCH_MODEL, str(bench_model_dir(home.root / "models" / BENCH_MODEL,
                                                                        tokenizer_dir)))
        server = stack.enter_context(ServerProcess(home, scheduler=False, extra_env={
            "TUNEFORGE_API_WORKERS": str(workers), "TUNEFORGE_RATE_LIMITS": RATE_LIMITS}))
        print(f"server:    {server.command_line} (pid {server.proc.pid})", flush=True)
        quiet_headers = {"Authorization": f"Bearer {quiet_key}"}
        flood_headers = {"Authorization": f"Bearer {flood_key}"}
        quiet_job, flood_job = seed_job(server, quiet_headers), seed_job(server, flood_headers)
        tenants = Tenants(quiet_headers, flood_headers,
                          RequestSpec("GET", f"/v1/fine_tuning/jobs/{quiet_job}"),
                          RequestSpec("GET", f"/v1/fine_tuning/jobs/{flood_job}"))
        print(f"tenants:   quiet ({QUIET_TIER}) reads {quiet_job} with {args.quiet_clients} clients at "
              f"{args.quiet_rate:.0f} req/s; flood ({FLOOD_TIER}) reads {flood_job} with {args.flood_clients} "
              f"clients, closed loop; {args.phase_s:.0f} s per phase\n", flush=True)
        results = [run_phase("quiet alone", server, tenants, args, flood=False),
                   run_phase(f"flood, limited ({FLOOD_TIER} tier)", server, tenants, args, flood=True)]
        print(f"  one more flood request over its limit: {check_retry_after(server, tenants)}", flush=True)
        home.cli("tenants", "set-tier", "flood", UNLIMITED_TIER)
        time.sleep(TIER_SETTLE_S)
        results.append(run_phase(f"flood, unlimited ({UNLIMITED_TIER} tier, baseline)", server, tenants, args,
                                 flood=True))
        print_table(results)
        passed, line = goal_line(results[1])
        unlimited = results[2].quiet
        line += (f"; quiet alone p99 {_f(results[0].quiet.ms(99), 1)} ms; under the unlimited flood "
                 f"{_f(unlimited.ms(99), 1)} ms with {sum(unlimited.errors.values())} failed")
        print(f"\n{line}")
        for headers in (quiet_headers, flood_headers):
            cancel_open_jobs(server, headers)
        print(f"load avg: {load_average()}")
        return passed, f"{label}: {line}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database", type=lambda t: _comma_list(t, str.lower, DATABASES), default=["sqlite"],
                        help="Comma list of sqlite, postgres (default sqlite).")
    parser.add_argument("--workers", type=_workers, default=[1, 2], help="Comma list of API worker counts.")
    parser.add_argument("--database-url", default=None, help="An existing PostgreSQL server (admin URL).")
    parser.add_argument("--pg-port", type=int, default=54339, help="Port of the scripts/pg.sh server otherwise.")
    parser.add_argument("--quiet-clients", type=int, default=50, help="The quiet tenant's keep-alive clients.")
    parser.add_argument("--quiet-rate", type=float, default=200.0, help="The quiet tenant's requests/s in all.")
    parser.add_argument("--flood-clients", type=int, default=50, help="The flood tenant's closed-loop clients.")
    parser.add_argument("--phase-s", type=float, default=None, help="Length of each phase.")
    parser.add_argument("--quick", action="store_true", help=f"Shorter phases: {QUICK} instead of {FULL}.")
    args = parser.parse_args(argv)
    if args.phase_s is None:
        args.phase_s = (QUICK if args.quick else FULL)["phase_s"]
    if args.quiet_clients < 1 or args.flood_clients < 1 or args.quiet_rate <= 0 or args.phase_s <= 0:
        parser.error("clients, rate and phase length must be positive")
    return args


def _interrupt(_signum, _frame) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    lines: list[str] = []
    try:
        with ExitStack() as stack:
            print("\n".join(machine_lines("; ".join(args.database))), flush=True)
            admin_url, tokenizer_dir = prerequisites(args, stack)
            for database in args.database:
                for workers in args.workers:
                    try:
                        _passed, line = run_combination(database, workers, admin_url, tokenizer_dir, args)
                    except (RuntimeError, OSError, httpx.HTTPError) as exc:
                        line = f"{database}, {workers} worker(s): failed: {exc}"
                        print(f"\n! {line}", flush=True)
                    lines.append(line)
    except KeyboardInterrupt:
        print("\ninterrupted: everything started here was stopped", file=sys.stderr)
        return 130
    print("\n== summary ==")
    print("\n".join(lines))
    return 0 if all(": failed:" not in line for line in lines) else 1


if __name__ == "__main__":
    sys.exit(main())
