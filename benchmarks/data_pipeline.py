"""Dataset check throughput: tuneforge's pipeline against a straightforward baseline.

    python benchmarks/data_pipeline.py [--rows 1000000] [--baseline-rows 20000] [--compare-rev REV [--rounds N]]

Generates synthetic chat examples (system + user + assistant, 150-700
characters, with planted exact and near duplicates), then measures, each in
its own process so peak RSS is that run's alone:

- tuneforge: `data.pipeline.check_dataset` — streaming parse and validation,
  token counting with the base model's tokenizer and chat template, exact and
  near (MinHash LSH, char 5-grams, Jaccard 0.9) dedup, PII scan, stats; on
  one worker process per core (`data.parallel`), as an upload check runs;
  its CPU time is reported for the main process and the workers;
- baseline: per-row `json.loads`, per-row `apply_chat_template(tokenize=True)`
  and per-row `datasketch.MinHash` (128 permutations, char 5-grams) with
  `MinHashLSH` insert + query — what one writes by hand — on the first
  `--baseline-rows` rows (its rate does not depend on the row count).

Both use the same tokenizer: the tiny demo model's byte-level BPE with its
ChatML template (built here; no download). Prints rows/s, peak RSS and the
speed-up. Nothing here is a test; figures go to docs/benchmarks-data.md.

`--compare-rev REV` (e.g. e89f4fd) also runs the tuneforge side with the code
of an earlier revision (its src/, taken with `git archive` into a temporary
folder and put on PYTHONPATH — for its workers too), on the same file in the
same run, and prints both sides: rows/s, CPU µs per row (main process and
workers), peak RSS, the load average before each side, and the reports'
figures (tokens, exact and near duplicates, errors, PII findings, and a digest
of the whole report), which must agree. `--rounds N` repeats both sides,
alternating which goes first. `--baseline-rows 0` skips the hand-written
baseline.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import platform
import random
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

WORDS = ("the model reads writes returns checks stores sends loads builds updates prints parses trains finds keeps "
         "file list numbers answer line config record result strings code table key value report error data "
         "server request worker cache queue batch token vector layer weight gradient loss step epoch").split()


def generate(path: Path, rows: int, seed: int = 0) -> dict[str, int]:
    rng = random.Random(seed)
    planted = {"exact": 0, "near": 0}
    previous: list[dict] = []
    with open(path, "w") as out:
        for i in range(rows):
            roll = rng.random()
            if previous and roll < 0.01:
                record = rng.choice(previous)  # exact duplicate
                planted["exact"] += 1
            elif previous and roll < 0.02:
                base = rng.choice(previous)
                answer = base["messages"][2]["content"]
                record = json.loads(json.dumps(base))
                record["messages"][2]["content"] = answer + " ok"  # near duplicate
                planted["near"] += 1
            else:
                question = " ".join(rng.choice(WORDS) for _ in range(rng.randint(10, 40)))
                answer = " ".join(rng.choice(WORDS) for _ in range(rng.randint(15, 90)))
                record = {"messages": [{"role": "system", "content": "You are a helpful assistant."},
                                       {"role": "user", "content": f"{question} (case {i})?"},
                                       {"role": "assistant", "content": answer}]}
                if len(previous) < 5000:
                    previous.append(record)
                elif rng.random() < 0.01:
                    previous[rng.randrange(len(previous))] = record
            out.write(json.dumps(record) + "\n")
    return planted


def run_tuneforge(data: Path, model_dir: Path) -> dict:
    import resource

    from transformers import AutoTokenizer

    from tuneforge.data.parallel import default_workers
    from tuneforge.data.pipeline import CheckOptions, check_dataset

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    before = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    report = check_dataset(data, CheckOptions(max_seq_length=512, min_examples=1), tokenizer=tokenizer)
    elapsed = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = [(a.ru_utime + a.ru_stime - b.ru_utime - b.ru_stime) for a, b in zip(after, before)]
    import tuneforge

    whole = json.dumps(report.to_dict(), sort_keys=True, default=str)
    return {"rows": report.num_rows, "seconds": elapsed, "ok": report.ok, "workers": default_workers(),
            "main_cpu_us_per_row": cpu[0] / report.num_rows * 1e6,
            "worker_cpu_us_per_row": cpu[1] / report.num_rows * 1e6,
            "worker_peak_rss_mib": after[1].ru_maxrss / 1024,  # the largest worker's
            "duplicates": report.duplicates.counts, "tokens": report.tokens.total,
            "examples": report.num_examples, "errors": sum(report.errors.counts.values()),
            "pii": sum(report.pii.counts.values()), "digest": hashlib.sha256(whole.encode()).hexdigest()[:16],
            "code": str(Path(tuneforge.__file__).parent)}


def run_baseline(data: Path, model_dir: Path, rows: int) -> dict:
    from datasketch import MinHash, MinHashLSH
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    lsh = MinHashLSH(threshold=0.9, num_perm=128)
    duplicates = tokens = done = 0
    started = time.perf_counter()
    with open(data) as handle:
        for index, line in enumerate(handle):
            if index >= rows:
                break
            record = json.loads(line)
            messages = record["messages"]
            tokens += len(tokenizer.apply_chat_template(messages, tokenize=True))
            text = " ".join(m["content"].lower() for m in messages)
            signature = MinHash(num_perm=128)
            for start in range(max(1, len(text) - 4)):
                signature.update(text[start:start + 5].encode())
            if lsh.query(signature):
                duplicates += 1
            else:
                lsh.insert(str(index), signature)
            done += 1
    return {"rows": done, "seconds": time.perf_counter() - started, "duplicates": duplicates, "tokens": tokens}


def _child(kind: str, data: Path, model_dir: Path, rows: int, src: Path = ROOT / "src") -> dict:
    """Run one side in a fresh interpreter with `src` first on its path (and its
    workers'); returns its figures and peak RSS."""
    code = (f"import json, resource, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
            f"import data_pipeline as b; from pathlib import Path; "
            f"r = b.run_tuneforge(Path({str(data)!r}), Path({str(model_dir)!r})) if {kind!r} == 'tuneforge' "
            f"else b.run_baseline(Path({str(data)!r}), Path({str(model_dir)!r}), {rows}); "
            f"r['peak_rss_mib'] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024; print(json.dumps(r))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False,
                         env={**os.environ, "TOKENIZERS_PARALLELISM": "true", "PYTHONPATH": str(src)})
    if out.returncode != 0:  # say why (a traceback, or a signal from outside) rather than only the command
        raise SystemExit(f"the {kind} side ({src}) exited with {out.returncode}:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def _revision_src(rev: str, into: Path) -> Path:
    """`rev`'s src/ extracted under `into` (git archive: no worktree, nothing in .git changes)."""
    archive = subprocess.run(["git", "archive", "--format=tar", rev, "src"], cwd=ROOT, capture_output=True,
                             check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def _this_name() -> str:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "src"], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()
    return f"{head.strip()}{'+changes' if dirty else ''}"


def compare(data: Path, model_dir: Path, rev: str, rounds: int, scratch: Path) -> None:
    """Both revisions on the same file, each side in its own process; prints the table and the reports."""
    sides = {rev: _revision_src(rev, scratch / "base"), f"this ({_this_name()})": ROOT / "src"}
    runs: dict[str, list[dict]] = {name: [] for name in sides}
    for round_number in range(rounds):
        order = list(sides.items()) if round_number % 2 == 0 else list(sides.items())[::-1]
        for name, src in order:
            load = _load()
            print(f"running {name} (round {round_number + 1}), load average {load} ...", flush=True)
            result = _child("tuneforge", data, model_dir, 0, src)
            result["load"] = load
            runs[name].append(result)
            print(f"  {result['rows'] / result['seconds']:,.0f} rows/s, {result['seconds']:.1f} s; code from "
                  f"{result['code']}", flush=True)
    print(f"\nload average at the end: {_load()} (1, 5, 15 min)")
    print("| revision | rows | seconds | rows/s | CPU us/row main + workers = total | peak RSS MiB main / "
          "largest worker | load before (1, 5, 15 min) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for name, results in runs.items():
        for r in results:
            total = r["main_cpu_us_per_row"] + r["worker_cpu_us_per_row"]
            print(f"| {name} | {r['rows']:,} | {r['seconds']:.1f} | {r['rows'] / r['seconds']:,.0f} | "
                  f"{r['main_cpu_us_per_row']:.1f} + {r['worker_cpu_us_per_row']:.1f} = {total:.1f} | "
                  f"{r['peak_rss_mib']:.0f} / {r['worker_peak_rss_mib']:.0f} | {r['load']} |")
    keys = ("examples", "tokens", "duplicates", "errors", "pii", "digest")
    for name, results in runs.items():
        print(f"report of {name}: " + ", ".join(f"{key} {results[0][key]}" for key in keys))
    figures = {json.dumps([r[key] for key in keys], sort_keys=True) for results in runs.values() for r in results}
    print("the reports agree (same figures and the same whole-report digest)" if len(figures) == 1
          else "THE REPORTS DIFFER")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--baseline-rows", type=int, default=20_000, help="0: no hand-written baseline")
    parser.add_argument("--compare-rev", default=None, help="also run the tuneforge side with this revision's code")
    parser.add_argument("--rounds", type=int, default=1, help="with --compare-rev: runs of each side")
    args = parser.parse_args()
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    print(f"machine: {os.cpu_count()} cores, {cpu}; Python {platform.python_version()}")
    with tempfile.TemporaryDirectory(prefix="tuneforge-bench-") as scratch:
        from tuneforge.demo.tiny_model import build_tiny_model

        model_dir = build_tiny_model(Path(scratch) / "model")
        data = Path(scratch) / "chat.jsonl"
        started = time.perf_counter()
        planted = generate(data, args.rows)
        print(f"generated {args.rows} rows ({data.stat().st_size / 2**20:.0f} MiB) in "
              f"{time.perf_counter() - started:.0f} s; planted {planted}")
        if args.compare_rev:
            compare(data, model_dir, args.compare_rev, args.rounds, Path(scratch))
            if not args.baseline_rows:
                return
        ours = _child("tuneforge", data, model_dir, args.rows)
        base = _child("baseline", data, model_dir, args.baseline_rows)
    ours_rate, base_rate = ours["rows"] / ours["seconds"], base["rows"] / base["seconds"]
    print(f"{'':12}{'rows':>10}{'seconds':>10}{'rows/s':>10}{'peak RSS MiB':>14}")
    for name, result, rate in (("tuneforge", ours, ours_rate), ("baseline", base, base_rate)):
        print(f"{name:12}{result['rows']:>10}{result['seconds']:>10.1f}{rate:>10.0f}{result['peak_rss_mib']:>14.0f}")
    print(f"tuneforge duplicates found: {ours['duplicates']}; tokens counted: {ours['tokens']}")
    print(f"tuneforge ran {ours['workers']} worker process(es); CPU per row: main "
          f"{ours['main_cpu_us_per_row']:.1f} us, workers {ours['worker_cpu_us_per_row']:.1f} us; "
          f"largest worker's peak RSS {ours['worker_peak_rss_mib']:.0f} MiB")
    print(f"speed-up over the baseline: {ours_rate / base_rate:.1f}x  (goal: >= 20,000 rows/s, < 2 GiB, >= 5x)")


if __name__ == "__main__":
    main()
