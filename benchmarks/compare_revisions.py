"""Training throughput of this checkout against an earlier revision, in one run.

    python benchmarks/compare_revisions.py --base e312a3e [--rounds 2] [-- ARGS for train_throughput.py]

For each round, `benchmarks/train_throughput.py --sides tuneforge` runs once
with the code of `--base` (a temporary git worktree, on PYTHONPATH) and once
with this checkout, alternating which goes first, on the same machine with the
same arguments (so the same model, data and settings). It prints each run's
real tokens/s in the training loop, end-to-end tokens/s and held-out eval loss,
and the ratio of this checkout to the base. Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROW = re.compile(r"^tuneforge\s+(?P<loop>[\d.]+)\s+(?P<e2e>[\d.]+)\s+(?P<steps>\d+)\s+(?P<tokens>[\d,]+)\s+"
                 r"(?P<tps>\d+)\s+(?P<e2e_tps>\d+)\s+(?P<padding>[\d.]+)%\s+(?P<rss>\d+) MiB\s+(?P<loss>[\d.]+)",
                 re.MULTILINE)


def run(tree: Path, args: list[str], label: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    command = [sys.executable, str(tree / "benchmarks" / "train_throughput.py"), "--sides", "tuneforge", *args]
    print(f"running {label} ({tree}) ...", flush=True)
    done = subprocess.run(command, env=env, cwd=tree, capture_output=True, text=True, check=False)
    match = ROW.search(done.stdout)
    if done.returncode != 0 or match is None:
        raise RuntimeError(f"{label} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    figures = {"tokens_per_s": float(match["tps"]), "e2e_tokens_per_s": float(match["e2e_tps"]),
               "loss": float(match["loss"]), "steps": int(match["steps"]),
               "real_tokens": int(match["tokens"].replace(",", ""))}
    print(f"  {label}: {figures['tokens_per_s']:.0f} real tokens/s in the loop, "
          f"{figures['e2e_tokens_per_s']:.0f} end to end, eval loss {figures['loss']:.4f}", flush=True)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="git revision to compare against")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("rest", nargs=argparse.REMAINDER, help="-- then arguments for train_throughput.py")
    args = parser.parse_args()
    extra = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    with tempfile.TemporaryDirectory(prefix="tuneforge-base-") as scratch:
        base_tree = Path(scratch) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", str(base_tree), args.base], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            runs: dict[str, list[dict[str, float]]] = {"base": [], "this": []}
            for round_number in range(args.rounds):
                order = [("base", base_tree), ("this", ROOT)]
                for label, tree in (order if round_number % 2 == 0 else order[::-1]):
                    runs[label].append(run(tree, extra, f"{label} round {round_number + 1}"))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base_tree)], cwd=ROOT, check=False,
                           capture_output=True)
    print()
    print(f"base {args.base} against this checkout ({head.strip()}), {args.rounds} round(s), "
          f"arguments: {' '.join(extra) or '(defaults)'}")
    for key, name in (("tokens_per_s", "real tokens/s (loop)"), ("e2e_tokens_per_s", "tokens/s end to end")):
        base = statistics.median(r[key] for r in runs["base"])
        this = statistics.median(r[key] for r in runs["this"])
        print(f"{name:<22} base {base:8.0f}   this {this:8.0f}   this/base {this / base:.3f}")
    losses = {label: [r["loss"] for r in found] for label, found in runs.items()}
    print(f"{'eval loss':<22} base {losses['base']}   this {losses['this']}")
    print(json.dumps(runs))


if __name__ == "__main__":
    main()
