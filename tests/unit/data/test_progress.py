"""The progress of a check, written by the worker that runs it for the process that waits (data/progress.py)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from tests.helpers.platform import chat_lines
from tuneforge.data import progress
from tuneforge.data.pipeline import CheckOptions, check_dataset
from tuneforge.data.structure import StructureReport


def test_the_check_with_progress_reports_as_check_dataset_does_and_ends_complete(tmp_path: Path) -> None:
    path = tmp_path / "train.jsonl"
    path.write_bytes(chat_lines(3000) + b'{"messages": "oops"}\n')
    out = tmp_path / "progress.json"
    options = CheckOptions(min_examples=1)
    report = progress.check_with_progress(path, options, out, name="train.jsonl", interval_s=0.01)
    assert report.to_dict() == check_dataset(path, options, name="train.jsonl").to_dict()
    size = path.stat().st_size
    assert progress.read_progress(out) == {"rows_checked": 3001, "bytes_checked": size, "bytes_total": size}
    assert not out.with_name("progress.json.tmp").exists()


def test_the_writer_reads_rows_from_the_pass_and_bytes_from_the_open_file(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    path.write_bytes(b"x" * 10_000)
    out = tmp_path / "progress.json"
    writer = progress.ProgressWriter(path, out, interval_s=60)
    structure = StructureReport()
    writer.watch(structure)
    assert writer.snapshot() == {"rows_checked": 0, "bytes_checked": 0, "bytes_total": 10_000}
    with path.open("rb") as handle:
        handle.seek(4_096)
        structure.num_rows = 12
        assert writer.snapshot() == {"rows_checked": 12, "bytes_checked": 4_096, "bytes_total": 10_000}
    # closed: the furthest offset seen is kept, never going back
    assert writer.snapshot()["bytes_checked"] == 4_096
    writer.write(finished=True)
    assert json.loads(out.read_text()) == {"rows_checked": 12, "bytes_checked": 10_000, "bytes_total": 10_000}


def test_the_watch_hook_sees_the_rows_grow_while_the_pass_runs(tmp_path: Path) -> None:
    path = tmp_path / "train.jsonl"
    path.write_bytes(chat_lines(5000))
    seen: list[int] = []
    watched: list[StructureReport] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.001):
            if watched:
                seen.append(watched[-1].num_rows)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        report = check_dataset(path, CheckOptions(min_examples=1, workers=1), watch=watched.append)
    finally:
        stop.set()
        sampler.join()
    assert report.num_examples == 5000 and watched[-1].num_rows == 5000
    assert seen == sorted(seen) and any(0 < rows < 5000 for rows in seen)
