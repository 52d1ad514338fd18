"""The dataset check pipeline: one streaming pass over a file, in batches.

    read rows (formats) → normalise (shapes) → method fit → token counts
    (token_count, when a tokenizer is given) → exact and near duplicates
    (dedup) → contamination against eval sets → PII (policy warn / redact /
    reject) → stats → DatasetReport

Memory is bounded by the batch size plus the compact dedup and contamination
indexes, whatever the file size. `on_batch` receives every batch of accepted
examples (after PII redaction) with their token counts, so a caller can write
the normalised dataset in the same pass.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuneforge.data import pii
from tuneforge.data.contamination import ContaminationIndex
from tuneforge.data.dedup import Deduplicator
from tuneforge.data.example import DataIssue, Example
from tuneforge.data.formats import resolve_format
from tuneforge.data.limits import DEFAULT_LIMITS, ReadLimits
from tuneforge.data.report import DatasetReport
from tuneforge.data.shapes import MethodFit
from tuneforge.data.structure import StructureReport, iter_examples
from tuneforge.data.token_count import TokenCounter

BatchSink = Callable[[Sequence[Example], Sequence[int]], None]


@dataclass
class CheckOptions:
    """How a dataset is checked; every field is a per-job or per-tenant choice."""

    method: MethodFit | None = None  # None (at upload): any shape, method fit checked at job creation
    data_format: str | None = None  # None: detected from magic bytes, extension, content
    max_errors_per_code: int = 20
    min_examples: int = 10
    max_examples: int | None = None
    max_seq_length: int | None = None
    long_examples: str = "truncate"  # "truncate": keep the first tokens; "reject": an error per example
    dedup: bool = True
    remove_duplicates: bool = False  # drop flagged duplicates from what `on_batch` receives
    near_duplicate_threshold: float = 0.9
    contamination_threshold: float = 0.5
    pii_policy: str = "warn"  # "warn" | "redact" | "reject"
    batch_rows: int = 2048
    limits: ReadLimits = DEFAULT_LIMITS
    workers: int | None = None  # processes for a large JSONL file; None: one per core (TUNEFORGE_DATA_WORKERS)
    parallel_min_bytes: int = 64 * 1024 * 1024  # smaller files are checked in this process (no start-up cost)


class _Run:
    """State of one pass; kept small so the pass reads as a list of steps."""

    def __init__(self, options: CheckOptions, tokenizer: Any, contamination: ContaminationIndex | None,
                 on_batch: BatchSink | None, threaded: bool = True) -> None:
        self.options = options
        self.tokenizer_name = None if tokenizer is None else \
            getattr(tokenizer, "name_or_path", None) or type(tokenizer).__name__
        self.report = self.new_report()
        self.counter = TokenCounter(tokenizer, options.max_seq_length or 1 << 30) if tokenizer is not None else None
        self.deduper = Deduplicator(threshold=options.near_duplicate_threshold) if options.dedup else None
        self.contamination = contamination
        self.on_batch = on_batch
        self.batch: list[Example] = []
        self.pending: tuple[list[Example], Future | None] | None = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tuneforge-tokens") if threaded else None

    def new_report(self) -> DatasetReport:
        options = self.options
        report = DatasetReport(method=options.method.name if options.method else "any", pii_policy=options.pii_policy,
                               max_seq_length=options.max_seq_length, tokenizer=self.tokenizer_name)
        report.errors.max_per_code = options.max_errors_per_code
        report.warnings.max_per_code = options.max_errors_per_code
        return report

    def error(self, issue: DataIssue) -> None:
        (self.report.warnings if issue.severity == "warning" else self.report.errors).add(issue)

    def add(self, example: Example) -> None:
        self.batch.append(example)
        if len(self.batch) >= self.options.batch_rows:
            self.flush()

    def flush(self) -> None:
        """Start counting this batch's tokens in the background (the Rust
        tokenizer releases the GIL), then finish the previous batch meanwhile:
        on two cores tokenization overlaps with the Python checks."""
        batch, self.batch = self.batch, []
        previous, self.pending = self.pending, None
        if batch:
            counting = self._pool.submit(self._token_counts, batch) \
                if self.counter is not None and self._pool is not None else None
            self.pending = (batch, counting)
        if previous is not None:
            self._finish(*previous)

    def close(self) -> None:
        try:
            self.flush()
            self.flush()  # the last batch was pending
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
            if self.deduper is not None:
                self.deduper.close()  # removes its temporary text file

    def _finish(self, batch: list[Example], counting: Future | None) -> None:
        counts = counting.result() if counting is not None else [None] * len(batch)
        texts = [example.joined_text() for example in batch]
        duplicates: set[int] = set()
        if self.deduper is not None:
            duplicates = self.record_duplicates(self.deduper.add_batch([e.line for e in batch], texts))
        self.check_examples(batch, texts, counts, duplicates)

    def record_duplicates(self, findings: list) -> set[int]:  # noqa: ANN001 - list[Finding]
        for finding in findings:
            self.report.duplicates.add(finding)
            self.report.warnings.add(DataIssue(finding.kind, _duplicate_message(finding), line=finding.line,
                                               severity="warning"))
        return {finding.line for finding in findings}

    def check_examples(self, batch: list[Example], texts: list[str], counts: Sequence[int | None],
                       duplicates: set[int]) -> None:
        """Everything done to each example on its own: contamination, PII, length, stats."""
        kept: list[Example] = []
        kept_counts: list[int] = []
        self._contamination(batch, texts)
        # one pass over the batch proves most texts hold nothing the PII scan could find
        candidates = pii.scan_candidates(texts)
        for example, text, count, candidate in zip(batch, texts, counts, candidates):
            if self.options.remove_duplicates and example.line in duplicates:
                self.report.removed_duplicates += 1
                continue
            if candidate:
                example = self._pii(example, text)
                if example is None:
                    continue
            if count is not None and not self._length_ok(example, count):
                continue
            kept.append(example)
            kept_counts.append(count or 0)
        self._stats(kept, kept_counts if self.counter is not None else None)
        self.report.num_examples += len(kept)
        if self.on_batch is not None and kept:
            self.on_batch(kept, kept_counts)

    def token_counts(self, batch: list[Example]) -> list[int | None]:
        return self._token_counts(batch) if self.counter is not None else [None] * len(batch)

    def _token_counts(self, batch: list[Example]) -> list[int | None]:
        counts, _exact = self.counter.count(batch)
        return list(counts)

    def _contamination(self, batch: list[Example], texts: list[str]) -> None:
        if self.contamination is None:
            return
        lines = [example.line for example in batch]
        for finding in self.contamination.check_batch(lines, texts, self.options.contamination_threshold):
            self.report.contamination.add(finding)
            self.report.warnings.add(DataIssue(
                "contamination", f"{finding.detail.get('overlap', 0):.0%} of its 13-grams appear in eval set "
                f"{finding.detail.get('source')!r}", line=finding.line, severity="warning"))

    def _pii(self, example: Example, joined: str) -> Example | None:
        findings, redacted = pii.apply_policy(example, self.options.pii_policy, joined)
        for finding in findings:
            self.report.pii.add(finding)
        if findings and self.options.pii_policy == "reject":
            kinds = sorted({f.kind for f in findings})
            self.error(DataIssue("pii_found", f"personal data or secrets found: {', '.join(kinds)}",
                                 line=example.line))
            return None
        return redacted

    def _length_ok(self, example: Example, count: int) -> bool:
        limit = self.options.max_seq_length
        if not limit or count <= limit:
            return True
        if self.options.long_examples == "reject":
            self.error(DataIssue("too_long", f"{count} tokens, over max_seq_length {limit}", line=example.line))
            return False
        self.report.truncated += 1
        self.report.warnings.add(DataIssue("truncated", f"{count} tokens; truncated to the first {limit}",
                                           line=example.line, severity="warning"))
        return True

    def _stats(self, examples: list[Example], counts: list[int] | None) -> None:
        """Token, turn, role and weight statistics of a batch's kept examples."""
        report = self.report
        if counts is not None:
            limit = self.options.max_seq_length
            report.tokens.add_many([min(count, limit) for count in counts] if limit else counts)
        turns = [len(example.messages) + (example.chosen is not None or example.rejected is not None)
                 for example in examples if example.messages is not None]  # chat, or a prompt plus its answer
        report.turns.add_many(turns)
        roles, weights = report.roles, report.weights
        for example in examples:
            for message in example.messages or ():
                role = str(message.get("role"))
                roles[role] = roles.get(role, 0) + 1
                if role == "assistant":
                    weight = str(message.get("weight", 1))
                    weights[weight] = weights.get(weight, 0) + 1


def _duplicate_message(finding) -> str:  # noqa: ANN001
    of = finding.detail.get("duplicate_of")
    if finding.kind == "near_duplicate":
        return f"near duplicate of line {of} (Jaccard {finding.detail.get('jaccard', 0):.2f})"
    return f"exact duplicate of line {of}"


def _check_here(path: Path, options: CheckOptions, structure: StructureReport, run: _Run, name: str | None) -> None:
    examples = iter_examples(path, options.data_format, options.method, report=structure,
                             limits=options.limits, name=name, min_examples=1)
    for example in examples:
        run.add(example)
        if options.max_examples and structure.num_examples > options.max_examples:
            structure.add(DataIssue("too_many_examples", f"more than {options.max_examples} examples for "
                                    "this tier", line=example.line))
            break


def _check_in_parallel(path: Path, options: CheckOptions, structure: StructureReport, run: _Run, name: str | None,
                       tokenizer: Any, contamination: ContaminationIndex | None) -> bool:
    """Run the check on several processes when it pays and the result is the same (see `data.parallel`)."""
    from tuneforge.data import parallel

    workers = options.workers if options.workers is not None else parallel.default_workers()
    if workers < 2 or run.on_batch is not None or options.remove_duplicates or path.is_dir():
        return False
    try:
        if path.stat().st_size < options.parallel_min_bytes:
            return False
        structure.format = resolve_format(path, options.data_format, name=name)
    except DataIssue:
        return False
    if structure.format != "jsonl":
        return False
    return parallel.check_jsonl_parallel(path, options, structure, run, tokenizer=tokenizer,
                                         contamination=contamination, workers=workers)


def check_dataset(
    path: Path,
    options: CheckOptions | None = None,
    *,
    name: str | None = None,
    tokenizer: Any = None,
    contamination: ContaminationIndex | None = None,
    on_batch: BatchSink | None = None,
    watch: Callable[[StructureReport], None] | None = None,
) -> DatasetReport:
    """Check a dataset file (or saved-datasets folder) in one streaming pass. `watch` is handed
    the pass's StructureReport as soon as it exists (again if the pass starts over in one process),
    so that another thread can read its `num_rows` grow: progress without slowing the pass."""
    options = options or CheckOptions()
    run = _Run(options, tokenizer, contamination, on_batch)
    structure = StructureReport(max_issues_per_code=options.max_errors_per_code)
    if watch is not None:
        watch(structure)
    try:
        if not _check_in_parallel(Path(path), options, structure, run, name, tokenizer, contamination):
            structure = StructureReport(max_issues_per_code=options.max_errors_per_code)
            if watch is not None:
                watch(structure)
            _check_here(Path(path), options, structure, run, name)
    finally:
        run.close()
    report = run.report
    report.data_format, report.kind, report.num_rows = structure.format, structure.kind, structure.num_rows
    for issue in structure.issues:
        (report.warnings if issue.severity == "warning" else report.errors).add_sample(issue)
    for code, count in structure.counts.items():
        severity_log = report.errors if any(i.code == code and i.severity == "error" for i in structure.issues) \
            else report.warnings
        severity_log.counts[code] = severity_log.counts.get(code, 0) + count
    if report.ok and report.num_examples < options.min_examples:
        report.errors.add(DataIssue("too_few_examples" if report.num_examples else "empty_file",
                                    f"{report.num_examples} valid examples; at least {options.min_examples} "
                                    "are required"
                                    if report.num_examples else "the file holds no examples"))
    return report
