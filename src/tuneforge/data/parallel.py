"""The dataset check of a large JSONL file on several processes.

Almost all of the check is per example (parsing, shape, PII, token counts,
contamination, stats, MinHash signatures); only duplicate detection needs
every earlier example. So the main process reads the file in blocks of
lines, worker processes check each block on their own and return a partial
report plus each example's normalised text and signature, and the main
process merges the partial reports in file order and runs the duplicate
index over the prepared signatures. The result equals the single-process
check (`pipeline.check_dataset` without workers): the same counts, the same
first issues per code, the same duplicates.

Used for plain or gzipped JSONL when nobody consumes the examples themselves
(an upload check, `tuneforge files validate`); preparing a job's dataset
writes examples in order and stays in one process. Memory: at most
`_IN_FLIGHT_PER_WORKER` blocks per worker are read ahead of the merge.
Workers are fresh interpreters (`python -m tuneforge.data.parallel`, not
forked: the control plane runs threads; not multiprocessing's spawn, which
re-imports the caller's main script), each loading the tokenizer once. They
talk over their stdin/stdout with length-prefixed pickles; a reader thread in
each worker drains its stdin, so neither side ever blocks on a full pipe.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np

from tuneforge.data.contamination import ContaminationIndex
from tuneforge.data.dedup import Deduplicator
from tuneforge.data.example import DataIssue, Example
from tuneforge.data.formats import GZIP_MAGIC, GuardedGunzip, parse_jsonl_line, split_lines
from tuneforge.data.report import DatasetReport
from tuneforge.data.shapes import check_method, normalize, skipped_kinds
from tuneforge.data.structure import StructureReport, _normalized
from tuneforge.security.env import child_env

_IN_FLIGHT_PER_WORKER = 3
_PEEK_BLOCKS = 16  # blocks read for the first valid example (it fixes the file's kind) before giving up

Block = list[tuple[int, bytes]]


def default_workers() -> int:
    """Processes for a parallel check: TUNEFORGE_DATA_WORKERS, else one per CPU core."""
    configured = os.environ.get("TUNEFORGE_DATA_WORKERS")
    if configured:
        return max(1, int(configured))
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@dataclasses.dataclass
class _BlockResult:
    structure: StructureReport
    report: DatasetReport
    lines: list[int]
    normalized: list[str]
    signature: np.ndarray | None


def _blocks(path: Path, options: Any) -> Iterator[Block]:
    """Non-blank lines of the file in blocks of `options.batch_rows`; a
    file-level problem (a line over the limit, a bomb) is raised as DataIssue."""
    with open(path, "rb") as raw:
        compressed = raw.read(len(GZIP_MAGIC)) == GZIP_MAGIC
        raw.seek(0)
        stream: Any = GuardedGunzip(raw, options.limits) if compressed else raw
        block: Block = []
        try:
            for line, data in split_lines(stream, options.limits):
                if not data or data.isspace():
                    continue
                block.append((line, data))
                if len(block) >= options.batch_rows:
                    yield block
                    block = []
        except DataIssue:
            if block:  # the lines before the problem are checked, as in one process
                yield block
            raise
        if block:
            yield block


def _first_kind(block: Block, method: Any) -> tuple[str, int] | None:
    """The kind and line of the block's first valid example."""
    for line, raw in block:
        record = parse_jsonl_line(raw, line)
        if isinstance(record, DataIssue):
            continue
        try:
            example, _ = normalize(record, line, skipped_kinds(method, None))
        except DataIssue:
            continue
        return example.kind, line
    return None


# --- worker side ----------------------------------------------------------------

_worker: dict[str, Any] = {}


def _start_worker(options: Any, tokenizer: Any, contamination: ContaminationIndex | None,
                  kind: str, kind_line: int) -> None:
    from tuneforge.data.pipeline import _Run

    local = dataclasses.replace(options, dedup=False, remove_duplicates=False)
    # one per worker, so the tokenizer's template costs and word counts are learned once
    _worker["run"] = _Run(local, tokenizer, contamination, on_batch=None, threaded=False)
    _worker["hasher"] = Deduplicator(threshold=options.near_duplicate_threshold) if options.dedup else None
    _worker.update(options=options, kind=kind, kind_line=kind_line)


def _check_block(block: Block) -> _BlockResult:
    options = _worker["options"]
    structure = StructureReport(max_issues_per_code=options.max_errors_per_code)
    structure.kind, structure.kind_line = _worker["kind"], _worker["kind_line"]
    examples: list[Example] = []
    for line, raw in block:
        structure.num_rows += 1
        record = parse_jsonl_line(raw, line)
        if isinstance(record, DataIssue):
            structure.add(record)
            continue
        example = _normalized(record, line, structure, options.method)
        if example is not None:
            structure.num_examples += 1
            examples.append(example)
    run = _worker["run"]
    run.report = run.new_report()
    texts = [example.joined_text() for example in examples]
    run.check_examples(examples, texts, run.token_counts(examples), set())
    normalized, signature = _worker["hasher"].prepare(texts) if _worker["hasher"] is not None else ([], None)
    return _BlockResult(structure, run.report, [example.line for example in examples], normalized, signature)


# --- main side ------------------------------------------------------------------


def check_jsonl_parallel(
    path: Path,
    options: Any,
    structure: StructureReport,
    run: Any,
    *,
    tokenizer: Any,
    contamination: ContaminationIndex | None,
    workers: int,
) -> bool:
    """Check the JSONL file at `path` on `workers` processes into `run.report`
    and `structure`. Returns False (having done nothing) when the file's first
    blocks hold no valid example: the caller then checks it in one process."""
    blocks = _blocks(path, options)
    peeked: list[Block] = []
    first: tuple[str, int] | None = None
    try:
        while first is None and len(peeked) < _PEEK_BLOCKS:
            block = next(blocks, None)
            if block is None:
                break
            peeked.append(block)
            first = _first_kind(block, options.method)
    except DataIssue:
        return False
    if first is None:
        return False
    structure.kind, structure.kind_line = first
    if options.method is not None:
        try:
            check_method(first[0], options.method, first[1])
        except DataIssue as issue:
            structure.add(issue)

    with _Workers(workers, (options, tokenizer, contamination, first[0], first[1])) as pool:
        source = _chain(peeked, blocks)
        try:
            for block in source:
                pool.submit(block)
                while pool.in_flight >= workers * _IN_FLIGHT_PER_WORKER:
                    if _merge(pool.next_result(), structure, run, options):
                        return True
        except DataIssue as issue:  # reading stopped (line too long, bomb): keep what was read
            while pool.in_flight:
                _merge(pool.next_result(), structure, run, options)
            structure.add(issue)
            return True
        while pool.in_flight:
            if _merge(pool.next_result(), structure, run, options):
                return True
    return True


class WorkerFailed(RuntimeError):
    """A check worker died or raised; the message holds its error."""


class _Workers:
    """Worker processes fed round-robin; results come back in submission order."""

    def __init__(self, count: int, setup: tuple) -> None:
        self._procs: list[subprocess.Popen] = []
        self._submitted = 0
        self._received = 0
        payload = pickle.dumps(setup, protocol=pickle.HIGHEST_PROTOCOL)
        env = child_env({"TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"})
        for _ in range(count):
            proc = subprocess.Popen([sys.executable, "-m", "tuneforge.data.parallel"], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, env=env)
            self._procs.append(proc)
            self._send(proc, payload)

    @property
    def in_flight(self) -> int:
        return self._submitted - self._received

    def submit(self, block: Block) -> None:
        proc = self._procs[self._submitted % len(self._procs)]
        self._send(proc, pickle.dumps(block, protocol=pickle.HIGHEST_PROTOCOL))
        self._submitted += 1

    @staticmethod
    def _send(proc: subprocess.Popen, payload: bytes) -> None:
        try:
            _send(proc.stdin, payload)
        except (BrokenPipeError, ValueError) as exc:
            raise WorkerFailed(f"a dataset check worker exited with code {proc.wait()}") from exc

    def next_result(self) -> _BlockResult:
        proc = self._procs[self._received % len(self._procs)]
        self._received += 1
        message = _receive(proc.stdout)
        if message is None:
            raise WorkerFailed(f"a dataset check worker exited with code {proc.wait()}")
        kind, value = pickle.loads(message)
        if kind == "error":
            raise WorkerFailed(f"a dataset check worker failed: {value}")
        return value

    def __enter__(self) -> _Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.in_flight:  # stopped early: nobody will read those results
            for proc in self._procs:
                proc.kill()
        for proc in self._procs:
            try:
                proc.stdin.close()
            except OSError:
                pass
        for proc in self._procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            proc.stdout.close()


_HEADER = struct.Struct("<Q")


def _send(stream: IO[bytes], payload: bytes) -> None:
    stream.write(_HEADER.pack(len(payload)))
    stream.write(payload)
    stream.flush()


def _receive(stream: IO[bytes]) -> bytes | None:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    return stream.read(_HEADER.unpack(header)[0])


def _serve() -> None:
    """A worker's life: read the setup, then check blocks until stdin closes."""
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing else may write into the result stream
    setup = _receive(stdin)
    if setup is None:
        return
    _start_worker(*pickle.loads(setup))
    # what setup built (tokenizer, modules) lives as long as the worker: out of the
    # collector's sight, a block's ~20k short-lived containers no longer make every
    # older-generation pass walk it (measured ~6 us a row)
    gc.freeze()
    blocks: queue.Queue[bytes | None] = queue.Queue()

    def drain() -> None:
        while (message := _receive(stdin)) is not None:
            blocks.put(message)
        blocks.put(None)

    threading.Thread(target=drain, daemon=True).start()
    while (message := blocks.get()) is not None:
        try:
            reply: tuple[str, Any] = ("ok", _check_block(pickle.loads(message)))
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises it
            reply = ("error", f"{type(exc).__name__}: {exc}")
        _send(stdout, pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL))


def _chain(peeked: list[Block], rest: Iterator[Block]) -> Iterator[Block]:
    yield from peeked
    yield from rest


def _merge(result: _BlockResult, structure: StructureReport, run: Any, options: Any) -> bool:
    """Fold one block's result in; True once the tier's example cap is passed (stop reading)."""
    part = result.structure
    before = structure.num_examples
    structure.num_rows += part.num_rows
    structure.num_examples += part.num_examples
    structure.num_errors += part.num_errors
    for code, count in part.counts.items():
        structure.counts[code] = structure.counts.get(code, 0) + count
    kept = {}
    for issue in structure.issues:
        kept[issue.code] = kept.get(issue.code, 0) + 1
    for issue in part.issues:
        if kept.get(issue.code, 0) < structure.max_issues_per_code:
            structure.issues.append(issue)
            kept[issue.code] = kept.get(issue.code, 0) + 1
    if run.deduper is not None and result.lines:
        run.record_duplicates(run.deduper.add_prepared(result.lines, result.normalized, result.signature))
    run.report.merge(result.report)
    if options.max_examples and structure.num_examples > options.max_examples:
        line = result.lines[options.max_examples - before] if result.lines else 0
        structure.add(DataIssue("too_many_examples", f"more than {options.max_examples} examples for this tier",
                                line=line))
        return True
    return False


if __name__ == "__main__":
    # through the package, so results pickle as tuneforge.data.parallel classes, not __main__ ones
    from tuneforge.data import parallel

    parallel._serve()
