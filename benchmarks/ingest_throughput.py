"""Rows per second through dataset ingestion on one core.

    python benchmarks/ingest_throughput.py [ROWS]

Writes ROWS (default 200,000) synthetic chat rows — system, user and
assistant turns, varied text, ~250 bytes a row — as JSONL, CSV and Parquet
into a temporary directory, then times, best of three runs each:

- read: `formats.iter_rows` alone (parse the file into records);
- read + normalise: `iter_rows` and `shapes.normalize` on every row;
- validate: `structure.validate_structure`, the whole structural check.

Only the JSONL figures are the target (> 50,000 rows/s for read + normalise);
CSV and Parquet are printed for comparison.
"""

from __future__ import annotations

import json
import os
import platform
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tuneforge import methods
from tuneforge.data import cells
from tuneforge.data.formats import iter_rows
from tuneforge.data.shapes import normalize
from tuneforge.data.structure import validate_structure

RUNS = 3
WORDS = ("the", "model", "answer", "token", "data", "train", "paris", "weather", "number", "question", "plan")


def synthetic_rows(count: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        question = " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 20)))
        answer = " ".join(rng.choice(WORDS) for _ in range(rng.randint(10, 30)))
        rows.append({"messages": [{"role": "system", "content": "You are a helpful assistant."},
                                  {"role": "user", "content": question + "?"},
                                  {"role": "assistant", "content": answer + "."}]})
    return rows


def write_sources(directory: Path, rows: list[dict]) -> dict[str, Path]:
    jsonl = directory / "chat.jsonl"
    jsonl.write_bytes(b"".join(json.dumps(row).encode() + b"\n" for row in rows))
    csv_path = directory / "chat.csv"
    with open(csv_path, "w", encoding="utf-8", newline="") as handle:
        handle.write("messages\n")
        handle.writelines('"' + json.dumps(row["messages"]).replace('"', '""') + '"\n' for row in rows)
    parquet = directory / "chat.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet, row_group_size=16_384)
    return {"jsonl": jsonl, "csv": csv_path, "parquet": parquet}


def read_only(path: Path) -> int:
    count = 0
    for _ in iter_rows(path):
        count += 1
    return count


def read_and_normalize(path: Path) -> int:
    count = 0
    for line, record in iter_rows(path):
        normalize(record, line)
        count += 1
    return count


def validate(path: Path) -> int:
    report = validate_structure(path, method=methods.get("supervised").fit)
    assert report.ok, report.first_error()
    return report.num_examples


def best_rate(step: Callable[[Path], int], path: Path) -> float:
    best_s = float("inf")
    count = 0
    for _ in range(RUNS):
        start = time.perf_counter()
        count = step(path)
        best_s = min(best_s, time.perf_counter() - start)
    return count / best_s


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    print(f"python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} cores, "
          f"json: {'orjson' if cells.loads.__module__ == 'orjson' else 'json'}; {count} chat rows, best of {RUNS}")
    with tempfile.TemporaryDirectory() as scratch:
        sources = write_sources(Path(scratch), synthetic_rows(count))
        for fmt, path in sources.items():
            size_mib = path.stat().st_size / 2**20
            figures = [f"{name} {best_rate(step, path):>9,.0f} rows/s" for name, step in
                       (("read", read_only), ("read+normalize", read_and_normalize), ("validate", validate))]
            print(f"{fmt:8s} {size_mib:6.1f} MiB  " + "  ".join(figures))


if __name__ == "__main__":
    main()
