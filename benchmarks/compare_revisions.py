"""Training throughput and API latency of this checkout against an earlier revision, in one run.

    python benchmarks/compare_revisions.py --base e312a3e [--bench both|train_throughput|api_latency]
        [--rounds 2] [--train-args="ARGS"] [--api-args="ARGS"] [--scripts own|this] [-- ARGS for train_throughput.py]

Each benchmark runs once per round with the code of `--base` (a temporary git
worktree, its src/ on PYTHONPATH) and once with this checkout, alternating
which goes first from round to round, on the same machine with the same
arguments:

- `train_throughput`: `benchmarks/train_throughput.py --sides tuneforge`;
  each run's real tokens/s in the training loop, end-to-end tokens/s and
  held-out eval loss, and the ratio of this checkout to the base.
- `api_latency`: `benchmarks/api_latency.py` (its own control plane, load
  generator and temp home per run). The per-phase tables it prints are read
  back, and for every combination (database, API workers), pass (50 clients,
  then one) and endpoint the comparison gives p50, p95 and p99 latency,
  requests/s and the server's CPU per request of the base and of this
  checkout, with their ratio: above 1 a latency or a CPU cost is higher here,
  a throughput is higher here.

The default arguments are short, so that a bare `--base REV` finishes in a few
minutes on two cores: train_throughput `--examples 120 --epochs 1` (its "quick
look") and api_latency `--quick --database sqlite --workers 1` (one SQLite
combination, 300 measured requests per endpoint: a few seconds each; its
one-client pass sends 50, so the server's CPU per request there moves in steps
of 0.2 ms, the clock tick over 50 requests).
`--train-args="..."` and `--api-args="..."` replace them (with the `=`: the
value starts with a dash; an empty string gives the benchmark's own, much
longer, defaults); `-- ARGS` at the end is taken as `--train-args`, as
before. With several rounds the comparison uses the median of each side's
runs.

`--scripts own` (the default) runs each revision's own copy of the benchmark
script; `--scripts this` runs this checkout's copy on both sides, so that the
same load generator and setup measure both revisions (the base must then
support what the script asks of the CLI).

Nothing here asserts a time. The output names the machine's cores and its load
average at the start, before each run and at the end: other work on the
machine moves every figure, and two short runs differ by more than noise
only when the ratio is far from 1.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCHES = ("train_throughput", "api_latency")
DEFAULT_TRAIN_ARGS = "--examples 120 --epochs 1"
DEFAULT_API_ARGS = "--quick --database sqlite --workers 1"

ROW = re.compile(r"^tuneforge\s+(?P<loop>[\d.]+)\s+(?P<e2e>[\d.]+)\s+(?P<steps>\d+)\s+(?P<tokens>[\d,]+)\s+"
                 r"(?P<tps>\d+)\s+(?P<e2e_tps>\d+)\s+(?P<padding>[\d.]+)%\s+(?P<rss>\d+) MiB\s+(?P<loss>[\d.]+)",
                 re.MULTILINE)

# api_latency.py: "== SQLite, 1 API worker(s): 300 requests per phase over 50 keep-alive client(s), ..." heads
# each pass; a markdown table whose header starts "| phase | request |" follows it
API_PASS = re.compile(r"^== (?P<combo>.+?): \d+ requests per phase over (?P<clients>\d+) keep-alive client")
API_TABLE_HEAD = re.compile(r"^\|\s*phase\s*\|\s*request\s*\|")
# the columns compared (name in the table, key, higher is better), those present in the revision's output
API_METRICS = (("p50 ms", "p50_ms", False), ("p95 ms", "p95_ms", False), ("p99 ms", "p99_ms", False),
               ("req/s", "req_per_s", True), ("server CPU ms/req", "server_cpu_ms_per_req", False))
API_FAILED = ("429", "5xx", "timeouts", "cut at deadline", "other failed", "failed")


# ---- the machine ---------------------------------------------------------------------------
def load_average() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def machine_line() -> str:
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    model = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                 if line.startswith("model name")]
        model = f", {names[0]}" if names else ""
    return (f"machine: {os.cpu_count()} cores ({usable} usable here){model}, {platform.system()} "
            f"{platform.release()}, Python {platform.python_version()}")


# ---- running a benchmark ----------------------------------------------------------------------
def run_script(code_tree: Path, script_tree: Path, script: str, args: list[str], label: str) -> str:
    """`python SCRIPT ARGS` with `code_tree`'s src/ on PYTHONPATH; returns its stdout."""
    env = {**os.environ, "PYTHONPATH": str(code_tree / "src")}
    command = [sys.executable, str(script_tree / "benchmarks" / script), *args]
    print(f"running {label} ({code_tree}), load average {load_average()} ...", flush=True)
    done = subprocess.run(command, env=env, cwd=code_tree, capture_output=True, text=True, check=False,
                          stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise RuntimeError(f"{label} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done.stdout


def parse_train(stdout: str, label: str) -> dict[str, float]:
    match = ROW.search(stdout)
    if match is None:
        raise RuntimeError(f"{label}: no tuneforge row in train_throughput's output:\n{stdout[-3000:]}")
    figures = {"tokens_per_s": float(match["tps"]), "e2e_tokens_per_s": float(match["e2e_tps"]),
               "loss": float(match["loss"]), "steps": int(match["steps"]),
               "real_tokens": int(match["tokens"].replace(",", ""))}
    print(f"  {label}: {figures['tokens_per_s']:.0f} real tokens/s in the loop, "
          f"{figures['e2e_tokens_per_s']:.0f} end to end, eval loss {figures['loss']:.4f}", flush=True)
    return figures


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def _api_row(columns: list[str], cells: list[str]) -> dict[str, float]:
    by_name = dict(zip(columns, cells))
    figures = {key: value for name, key, _ in API_METRICS
               if name in by_name and (value := _number(by_name[name])) is not None}
    failed = [_number(by_name[name]) for name in API_FAILED if name in by_name]
    figures["failed"] = sum(value for value in failed if value is not None)
    other = _number(by_name.get("other cores", ""))
    if other is not None:
        figures["other_cores"] = other  # cores kept busy by neither the server nor the load generator
    return figures


def parse_api(stdout: str, label: str) -> dict[str, dict[str, float]]:
    """Figures per "combination | N clients | phase", from every per-pass table api_latency.py printed."""
    found: dict[str, dict[str, float]] = {}
    section, columns = "", None
    for line in stdout.splitlines():
        head = API_PASS.match(line)
        if head:
            section, columns = f"{head['combo']} | {head['clients']} clients", None
        elif section and API_TABLE_HEAD.match(line):
            columns = _cells(line)
        elif columns and line.startswith("|") and not line.startswith("|-"):
            cells = _cells(line)
            found[f"{section} | {cells[0]}"] = _api_row(columns, cells)
        elif columns and not line.startswith("|"):
            columns = None
    if not found:
        raise RuntimeError(f"{label}: no phase table in api_latency's output:\n{stdout[-3000:]}")
    print(f"  {label}: {len(found)} phase(s) read", flush=True)
    return found


@dataclass(frozen=True)
class Bench:
    name: str
    script: str
    fixed_args: tuple[str, ...]
    parse: Callable[[str, str], dict]


BENCH_SPECS = {
    "train_throughput": Bench("train_throughput", "train_throughput.py", ("--sides", "tuneforge"), parse_train),
    "api_latency": Bench("api_latency", "api_latency.py", (), parse_api),
}


# ---- reporting --------------------------------------------------------------------------------
def print_train(runs: dict[str, list[dict[str, float]]]) -> None:
    for key, name in (("tokens_per_s", "real tokens/s (loop)"), ("e2e_tokens_per_s", "tokens/s end to end")):
        base = statistics.median(r[key] for r in runs["base"])
        this = statistics.median(r[key] for r in runs["this"])
        print(f"{name:<22} base {base:8.0f}   this {this:8.0f}   this/base {this / base:.3f}")
    losses = {label: [r["loss"] for r in found] for label, found in runs.items()}
    print(f"{'eval loss':<22} base {losses['base']}   this {losses['this']}")


def _median(runs: list[dict[str, dict[str, float]]], phase: str, key: str) -> float | None:
    values = [run[phase][key] for run in runs if key in run.get(phase, {})]
    return statistics.median(values) if len(values) == len(runs) else None


def _fmt(value: float) -> str:
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.2f}"


def _compared(base: float | None, this: float | None) -> str:
    if base is None or this is None:
        return f"{'-':>24}"
    ratio = f"x{this / base:.2f}" if base else "x -"
    return f"{_fmt(base):>8} -> {_fmt(this):>8} {ratio:>6}"


def _other_cores(runs: list[dict[str, dict[str, float]]], phases: list[str]) -> str:
    values = [run[phase]["other_cores"] for run in runs for phase in phases if "other_cores" in run[phase]]
    return f"{min(values):.2f} to {max(values):.2f}" if values else "-"


def print_api(runs: dict[str, list[dict[str, dict[str, float]]]]) -> None:
    phases = [phase for phase in runs["this"][0] if all(phase in run for run in runs["base"] + runs["this"])]
    missing = sorted({phase for run in runs["base"] + runs["this"] for phase in run} - set(phases))
    print("per endpoint: base -> this checkout and this/base; latency and CPU above x1.00: higher here; "
          "req/s above x1.00: more here")
    metrics = [(key, name) for name, key, _ in API_METRICS
               if any(_median(runs["base"], phase, key) is not None for phase in phases)]
    width = max((len(phase.rsplit(" | ", 1)[1]) for phase in phases), default=5)
    section = None
    for phase in phases:
        where, endpoint = phase.rsplit(" | ", 1)
        if where != section:
            section = where
            print(f"\n{where}")
            print(f"  {'phase':<{width}}  " + "  ".join(f"{name:^24}" for _, name in metrics)
                  + "  failed base / this")
        cells = [_compared(_median(runs["base"], phase, key), _median(runs["this"], phase, key))
                 for key, _ in metrics]
        failed = [sum(run[phase].get("failed", 0) for run in runs[label]) for label in ("base", "this")]
        print(f"  {endpoint:<{width}}  " + "  ".join(cells) + f"  {failed[0]:.0f} / {failed[1]:.0f}")
        if phase == phases[-1] or not phases[phases.index(phase) + 1].startswith(where + " | "):
            mine = [p for p in phases if p.startswith(where + " | ")]
            print(f"  cores kept busy by other processes during these phases: base {_other_cores(runs['base'], mine)}"
                  f", this {_other_cores(runs['this'], mine)} (0 on a quiet machine without a database server)")
    if missing:
        print(f"\nonly on one side (not compared): {', '.join(missing)}")


# ---- the run ------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="git revision to compare against")
    parser.add_argument("--bench", choices=(*BENCHES, "both"), default="both", help="which benchmark(s) to compare")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--train-args", default=None,
                        help=f"--train-args='ARGS' for train_throughput.py (default: {DEFAULT_TRAIN_ARGS!r}; "
                             "'' for its own)")
    parser.add_argument("--api-args", default=None,
                        help=f"--api-args='ARGS' for api_latency.py (default: {DEFAULT_API_ARGS!r}; '' for its own)")
    parser.add_argument("--scripts", choices=("own", "this"), default="own",
                        help="own: each revision runs its own benchmark script; this: this checkout's on both sides")
    parser.add_argument("rest", nargs=argparse.REMAINDER, help="-- then arguments for train_throughput.py")
    args = parser.parse_args(argv)
    rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
    if rest and args.train_args is not None:
        parser.error("give train_throughput's arguments either with --train-args or after --, not both")
    args.bench_args = {
        "train_throughput": rest or shlex.split(DEFAULT_TRAIN_ARGS if args.train_args is None else args.train_args),
        "api_latency": shlex.split(DEFAULT_API_ARGS if args.api_args is None else args.api_args),
    }
    args.benches = list(BENCHES) if args.bench == "both" else [args.bench]
    return args


def run_rounds(args: argparse.Namespace, base_tree: Path) -> tuple[dict[str, dict[str, list]], dict[str, list]]:
    """Every benchmark's parsed figures per side, and the 1-minute load average before each run."""
    runs: dict[str, dict[str, list]] = {name: {"base": [], "this": []} for name in args.benches}
    loads: dict[str, list[str]] = {name: [] for name in args.benches}
    for name in args.benches:
        script = BENCH_SPECS[name].script
        for label, tree in (("base", base_tree), ("this", ROOT)):
            script_tree = ROOT if args.scripts == "this" else tree
            if not (script_tree / "benchmarks" / script).exists():
                raise SystemExit(f"{label} ({script_tree}) has no benchmarks/{script}"
                                 + ("; try --scripts this" if label == "base" else ""))
    for round_number in range(args.rounds):
        order = [("base", base_tree), ("this", ROOT)]
        for name in args.benches:
            bench = BENCH_SPECS[name]
            for label, tree in (order if round_number % 2 == 0 else order[::-1]):
                script_tree = ROOT if args.scripts == "this" else tree
                run_label = f"{name} {label} round {round_number + 1}"
                loads[name].append(f"{label} r{round_number + 1} {os.getloadavg()[0]:.2f}")
                stdout = run_script(tree, script_tree, bench.script, [*bench.fixed_args, *args.bench_args[name]],
                                    run_label)
                runs[name][label].append(bench.parse(stdout, run_label))
    return runs, loads


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    this_name = f"{head.strip()}{' + uncommitted changes' if dirty else ''}"
    start_load = load_average()
    print(machine_line())
    print(f"load average at start: {start_load} (1, 5, 15 min)", flush=True)
    with tempfile.TemporaryDirectory(prefix="tuneforge-base-") as scratch:
        base_tree = Path(scratch) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", str(base_tree), args.base], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            runs, loads = run_rounds(args, base_tree)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base_tree)], cwd=ROOT, check=False,
                           capture_output=True)
    print()
    print(machine_line())
    print(f"load average (1, 5, 15 min): {start_load} at start, {load_average()} at the end; other work on this "
          f"machine moves every figure below")
    for name in args.benches:
        print(f"\n== {name}: base {args.base} against this checkout ({this_name}), {args.rounds} round(s), "
              f"{'each revision its own script' if args.scripts == 'own' else 'this checkout script on both'}, "
              f"arguments: {' '.join(args.bench_args[name]) or '(its defaults)'} ==")
        print(f"1-minute load average before each run, in the order run: {', '.join(loads[name])}")
        (print_train if name == "train_throughput" else print_api)(runs[name])
    print()
    print(json.dumps(runs))


if __name__ == "__main__":
    main()
