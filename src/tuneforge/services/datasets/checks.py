"""Dataset checks at upload and at job validation, and prepared datasets.

At upload a file gets the structural and content checks (no tokenizer yet):
its status becomes `processed` or `error`, and the full report is kept for
`GET /v1/files/{id}/validation`.

At job validation the same pass runs again against the job's base-model
tokenizer and options (method fit, token lengths, PII policy, duplicate
removal, split). Its output is a *prepared dataset*: normalised JSONL the
trainer reads whatever the upload's format, stored once per (file content,
base model, max_seq_length, method, data options) and reused by later jobs.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

from tuneforge import methods
from tuneforge.data import isolation
from tuneforge.data.example import DataIssue, Example
from tuneforge.data.pipeline import CheckOptions, check_dataset
from tuneforge.data.report import DatasetReport
from tuneforge.data.shapes import method_shapes
from tuneforge.domain.errors import not_found
from tuneforge.storage import layout
from tuneforge.storage.store import ObjectStore

# Examples per tier (a cap on what one job may train on); bytes are capped at upload.
MAX_EXAMPLES_BY_TIER = {"free": 50_000, "standard": 2_000_000, "premium": 20_000_000}
PREPARED_VERSION = 1  # bump when the prepared format changes, so old caches are not reused
# An upload's check runs in a worker (data.isolation) and fails past this deadline: a
# fixed allowance plus the slowest rate a real file is checked at (real files: ~20 MB/s).
CHECK_DEADLINE_BASE_S = 60
CHECK_MIN_BYTES_PER_S = 512 * 1024
# Preparing a job's data also tokenizes it: it may take this many times an upload's check.
PREPARE_DEADLINE_FACTOR = 4


@contextmanager
def local_copy(store: ObjectStore, key: str, suffix: str = "") -> Iterator[Path]:
    """The object as a local file (checks stream from disk, not from S3)."""
    with tempfile.TemporaryDirectory(prefix="tuneforge-check-") as scratch:
        path = Path(scratch) / f"data{suffix}"
        store.get_file(key, path)
        yield path


def check_upload(store: ObjectStore, key: str, filename: str, tenant_id: str, file_id: str, tier: str,
                 contamination=None, progress_path: Path | None = None) -> DatasetReport:  # noqa: ANN001
    """The upload checks of a file's bytes, its report kept for `GET /v1/files/{id}/validation`.
    `progress_path`: where the worker writes how far it has got (`data.progress`)."""
    options = CheckOptions(method=None, min_examples=1, max_examples=MAX_EXAMPLES_BY_TIER.get(tier))
    with local_copy(store, key) as path:
        report = check_in_worker(path, options, filename, contamination, progress_path=progress_path)
    store.put_bytes(layout.file_report_key(tenant_id, file_id), json.dumps(report.to_dict()).encode())
    return report


def check_deadline_s(size_bytes: int) -> float:
    """How long the check of a file of `size_bytes` may take before it fails."""
    return CHECK_DEADLINE_BASE_S + size_bytes / CHECK_MIN_BYTES_PER_S


def check_in_worker(path: Path, options: CheckOptions, filename: str, contamination=None,  # noqa: ANN001
                    deadline_s: float | None = None, progress_path: Path | None = None) -> DatasetReport:
    """`check_dataset` in a worker process under a deadline (`data.isolation`): the API worker
    only waits, and a file that takes too long fails its check instead of taking the worker down.
    With `progress_path`, the worker writes its progress there as it goes (`data.progress`)."""
    deadline_s = check_deadline_s(_size_bytes(path)) if deadline_s is None else deadline_s
    try:
        if progress_path is not None:
            return isolation.call_isolated("tuneforge.data.progress:check_with_progress",
                                           (path, options, progress_path), deadline_s, name=filename,
                                           contamination=contamination)
        return isolation.call_isolated("tuneforge.data.pipeline:check_dataset", (path, options), deadline_s,
                                       name=filename, contamination=contamination)
    except isolation.DeadlineExceeded:
        issue = DataIssue("check_timeout", f"checking {filename} took longer than {deadline_s:.0f} s, the limit "
                          f"for a file of its size ({CHECK_DEADLINE_BASE_S} s + 1 s per "
                          f"{CHECK_MIN_BYTES_PER_S // 1024} KiB); the file is not used")
    except (isolation.WorkerDied, MemoryError):  # MemoryError: past the worker's memory cap
        issue = DataIssue("check_failed", f"the check of {filename} stopped before it finished (it ran out of "
                          "memory or crashed); the file is not used")
    report = DatasetReport(method="any", pii_policy=options.pii_policy)
    report.errors.add(issue)
    return report


def _size_bytes(path: Path) -> int:
    if path.is_dir():
        return sum(child.stat().st_size for child in path.rglob("*") if child.is_file())
    return path.stat().st_size


def read_report(store: ObjectStore, key: str, missing: str, param: str) -> dict[str, Any]:
    """A stored validation report; 404 `report_not_found` with `missing` when there is none."""
    if not store.exists(key):
        raise not_found(missing, param=param, code="report_not_found")
    return json.loads(store.get_bytes(key))


def file_report(store: ObjectStore, tenant_id: str, file_id: str, purpose: str, status: str = "processed",
                ) -> dict[str, Any]:
    if status == "processing":  # a report left by an earlier, lost run is not this file's outcome
        raise not_found(f"{file_id} is still being validated (status processing): its report is here once the "
                        f"status is processed or error (GET /v1/files/{file_id})", param="file_id",
                        code="report_not_ready")
    return read_report(store, layout.file_report_key(tenant_id, file_id),
                       f"{file_id} has no validation report (purpose {purpose!r})", "file_id")


def job_report(store: ObjectStore, tenant_id: str, job_id: str) -> dict[str, Any]:
    return read_report(store, layout.job_report_key(tenant_id, job_id),
                       f"{job_id} has not been validated yet", "fine_tuning_job_id")


def example_record(example: Example) -> dict[str, Any]:
    """An Example as one line of the prepared JSONL the trainer reads."""
    for shape in method_shapes():
        if shape.kind == example.kind:
            return shape.to_record(example)
    if example.kind == "chat":
        record: dict[str, Any] = {"messages": example.messages}
        if example.tools:
            record["tools"] = example.tools
        return record
    if example.kind == "instruction":
        return {"prompt": example.prompt, "completion": example.completion}
    if example.kind == "preference":
        prompt: dict[str, Any] = {"messages": example.messages}
        if example.tools:
            prompt["tools"] = example.tools
        return {"input": prompt, "preferred_output": [example.chosen], "non_preferred_output": [example.rejected]}
    return {"text": example.text}


def _held_out(seed: int, line: int, fraction: float) -> bool:
    """Deterministic by (seed, line), independent of batching and of other rows."""
    digest = hashlib.blake2b(f"{seed}:{line}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < fraction


@dataclass
class PreparedWriter:
    """Writes accepted examples as JSONL, routing a seeded share to validation."""

    train: IO[bytes]
    valid: IO[bytes] | None
    seed: int
    split_fraction: float
    train_count: int = 0
    valid_count: int = 0
    train_tokens: int = 0

    def __call__(self, examples: Sequence[Example], token_counts: Sequence[int]) -> None:
        for example, count in zip(examples, token_counts):
            line = json.dumps(example_record(example), ensure_ascii=False).encode() + b"\n"
            if (self.valid is not None and self.split_fraction
                    and _held_out(self.seed, example.line, self.split_fraction)):
                self.valid.write(line)
                self.valid_count += 1
            else:
                self.train.write(line)
                self.train_count += 1
                self.train_tokens += int(count)


def dataset_id(parts: dict[str, Any]) -> str:
    canonical = json.dumps({"v": PREPARED_VERSION, **parts}, sort_keys=True)
    return "ds-" + hashlib.sha256(canonical.encode()).hexdigest()[:32]


@dataclass
class PreparedDataset:
    dataset_id: str
    train_key: str
    valid_key: str | None
    train_examples: int
    valid_examples: int
    train_tokens: int
    report: dict[str, Any]
    reused: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"dataset_id": self.dataset_id, "train_key": self.train_key, "valid_key": self.valid_key,
                "train_examples": self.train_examples, "valid_examples": self.valid_examples,
                "train_tokens": self.train_tokens}


class DataCheckFailed(Exception):
    def __init__(self, report: DatasetReport, which: str) -> None:
        super().__init__(report.summary())
        self.report = report
        self.which = which  # "training_file" | "validation_file"


@dataclass
class PrepareRequest:
    tenant_id: str
    training: tuple[str, str, str]  # (file key, filename, sha256)
    validation: tuple[str, str, str] | None
    base_sha256: str
    method: str
    max_seq_length: int
    seed: int
    options: dict[str, Any]  # the job's `data` options, resolved
    pii_policy: str
    required_fields: tuple[str, ...] = ()  # fields every line must hold (those the job's grader reads)


def _check_options(request: PrepareRequest, min_examples: int, *, for_validation: bool) -> CheckOptions:
    opts = request.options
    return CheckOptions(
        method=replace(methods.get(request.method).fit, required_fields=request.required_fields),
        data_format=opts.get("format"), min_examples=min_examples,
        max_seq_length=request.max_seq_length, long_examples=opts.get("long_examples", "truncate"),
        near_duplicate_threshold=opts.get("near_duplicate_threshold", 0.9),
        contamination_threshold=opts.get("contamination_threshold", 0.5),
        remove_duplicates=bool(opts.get("remove_duplicates")) and not for_validation,
        pii_policy=request.pii_policy,
    )


def prepare_for_job(store: ObjectStore, request: PrepareRequest, tokenizer: Any, *, min_examples: int,
                    contamination=None, keep: bool = True) -> PreparedDataset:  # noqa: ANN001
    """Check the job's files against its tokenizer and write the prepared dataset,
    or reuse the one an identical earlier job prepared. `keep=False` (an estimate) checks and
    counts without writing anything to the store: nothing is left behind for a job that may
    never exist."""
    split = float(request.options.get("validation_split") or 0.0) if request.validation is None else 0.0
    ident = dataset_id({"train": request.training[2], "valid": request.validation and request.validation[2],
                        "base": request.base_sha256, "method": request.method, "max_seq": request.max_seq_length,
                        "options": request.options, "pii": request.pii_policy, "seed": request.seed if split else None,
                        **({"fields": list(request.required_fields)} if request.required_fields else {})})
    manifest_key = layout.dataset_key(request.tenant_id, ident, "manifest.json")
    if store.exists(manifest_key):
        prepared = PreparedDataset(**json.loads(store.get_bytes(manifest_key)))
        prepared.reused = True
        return prepared
    train_key = layout.dataset_key(request.tenant_id, ident, "train.jsonl")
    valid_key = layout.dataset_key(request.tenant_id, ident, "valid.jsonl")
    with tempfile.TemporaryDirectory(prefix="tuneforge-prepare-") as scratch:
        train_path, valid_path = Path(scratch) / "train.jsonl", Path(scratch) / "valid.jsonl"
        outcome = _prepare_in_worker(store, request, tokenizer, contamination, min_examples, train_path, valid_path)
        if outcome.failed is not None:
            raise DataCheckFailed(outcome.report, outcome.failed)
        report, counts = outcome.report, outcome.counts
        has_valid = counts.valid_count > 0
        prepared = PreparedDataset(ident, train_key, valid_key if has_valid else None, counts.train_count,
                                   counts.valid_count, counts.train_tokens, report.to_dict())
        if not keep:
            return prepared
        store.put_file(train_key, train_path)
        if has_valid:
            store.put_file(valid_key, valid_path)
    store.put_bytes(manifest_key, json.dumps(prepared.__dict__ | {"reused": False}).encode())  # written last
    return prepared


@dataclass
class _Counts:
    train_count: int = 0
    valid_count: int = 0
    train_tokens: int = 0


@dataclass
class _Prepared:
    """What the check worker hands back: the training file's report, which file failed (None when
    both passed) and the counts of what it wrote."""

    report: DatasetReport
    failed: str | None
    counts: _Counts


def _prepare_in_worker(store: ObjectStore, request: PrepareRequest, tokenizer: Any, contamination,  # noqa: ANN001
                       min_examples: int, train_path: Path, valid_path: Path) -> _Prepared:
    """The files checked against the tokenizer and written as prepared JSONL, in a check worker
    under a deadline (`data.isolation`): a job's data never holds the scheduler or an API worker
    for longer than its size allows, and a file that takes longer fails as a data error."""
    with local_copy(store, request.training[0]) as train_source, \
            _optional_copy(store, request.validation) as valid_source:
        sources = [train_source] + ([valid_source] if valid_source is not None else [])
        deadline_s = PREPARE_DEADLINE_FACTOR * check_deadline_s(sum(_size_bytes(path) for path in sources))
        try:
            return isolation.call_isolated(
                "tuneforge.services.datasets.checks:prepare_files", (request, train_source, valid_source, train_path,
                                                              valid_path), deadline_s,
                tokenizer=tokenizer, contamination=contamination, min_examples=min_examples)
        except isolation.DeadlineExceeded:
            issue = DataIssue("check_timeout", f"preparing {request.training[1]} for training took longer than "
                                               f"{deadline_s:.0f} s, the limit for files of their size")
        except (isolation.WorkerDied, MemoryError):
            issue = DataIssue("check_failed", f"preparing {request.training[1]} for training stopped before it "
                                              "finished (it ran out of memory or crashed)")
    report = DatasetReport(method=request.method, pii_policy=request.pii_policy)
    report.errors.add(issue)
    return _Prepared(report, "training_file", _Counts())


@contextmanager
def _optional_copy(store: ObjectStore, source: tuple[str, str, str] | None) -> Iterator[Path | None]:
    if source is None:
        yield None
        return
    with local_copy(store, source[0]) as path:
        yield path


def prepare_files(request: PrepareRequest, train_source: Path, valid_source: Path | None, train_path: Path,
                  valid_path: Path, *, tokenizer: Any, contamination, min_examples: int) -> _Prepared:  # noqa: ANN001
    """Runs in a check worker: checks the local copies of the job's files and writes the accepted
    examples to `train_path` / `valid_path`."""
    split = float(request.options.get("validation_split") or 0.0) if request.validation is None else 0.0
    with open(train_path, "wb") as train_out, open(valid_path, "wb") as valid_out:
        writer = PreparedWriter(train_out, valid_out, request.seed, split)
        report = check_dataset(train_source, _check_options(request, min_examples, for_validation=False),
                               name=request.training[1], tokenizer=tokenizer, contamination=contamination,
                               on_batch=writer)
        if not report.ok:
            return _Prepared(report, "training_file", _Counts())
        if request.validation is not None and valid_source is not None:
            held = PreparedWriter(valid_out, None, request.seed, 0.0)
            valid_report = check_dataset(valid_source, _check_options(request, 1, for_validation=True),
                                         name=request.validation[1], tokenizer=tokenizer, contamination=None,
                                         on_batch=held)
            if not valid_report.ok:
                return _Prepared(valid_report, "validation_file", _Counts())
            writer.valid_count += held.train_count
    if writer.train_count < min_examples:
        report.errors.add(_too_few_after_split(writer.train_count, min_examples))
        return _Prepared(report, "training_file", _Counts())
    return _Prepared(report, None, _Counts(writer.train_count, writer.valid_count, writer.train_tokens))


def _too_few_after_split(count: int, minimum: int) -> DataIssue:
    return DataIssue("too_few_examples", f"{count} training examples remain after removals and the validation "
                                         f"split; at least {minimum} are required")
