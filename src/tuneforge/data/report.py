"""The dataset validation report: what `GET /v1/files/{id}/validation` returns.

Issues are grouped by code: the count of every code, and the first
`max_per_code` occurrences with line numbers and a short excerpt, so a
million-row file with one systematic mistake gives a short, precise report.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tuneforge.data.example import DataIssue, Finding

HISTOGRAM_EDGES = (0, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


@dataclass
class IssueLog:
    max_per_code: int = 20
    counts: dict[str, int] = field(default_factory=dict)
    samples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def add(self, issue: DataIssue) -> None:
        self.counts[issue.code] = self.counts.get(issue.code, 0) + 1
        self.add_sample(issue)

    def add_sample(self, issue: DataIssue) -> None:
        """Keep `issue` as an example of its code without counting it (counted elsewhere)."""
        self.counts.setdefault(issue.code, 0)
        bucket = self.samples.setdefault(issue.code, [])
        if len(bucket) < self.max_per_code:
            bucket.append(issue.to_dict())

    def merge(self, other: IssueLog) -> None:
        """Add `other`'s counts and samples (of later lines: merge in file order)."""
        for code, count in other.counts.items():
            self.counts[code] = self.counts.get(code, 0) + count
        for code, samples in other.samples.items():
            bucket = self.samples.setdefault(code, [])
            bucket += samples[: max(0, self.max_per_code - len(bucket))]

    def first(self) -> dict[str, Any] | None:
        """The earliest issue by line (line 0, the whole file, comes first)."""
        candidates = [sample for bucket in self.samples.values() for sample in bucket]
        return min(candidates, key=lambda s: s["line"]) if candidates else None

    def to_dict(self) -> dict[str, Any]:
        return {code: {"count": self.counts[code], "first": self.samples.get(code, [])}
                for code in sorted(self.counts)}

    def __bool__(self) -> bool:
        return bool(self.counts)


@dataclass
class FindingLog:
    max_samples: int = 50
    counts: dict[str, int] = field(default_factory=dict)
    samples: list[dict[str, Any]] = field(default_factory=list)
    lines: set[int] = field(default_factory=set)

    def add(self, finding: Finding) -> None:
        self.counts[finding.kind] = self.counts.get(finding.kind, 0) + 1
        self.lines.add(finding.line)
        if len(self.samples) < self.max_samples:
            self.samples.append({"line": finding.line, "kind": finding.kind, **finding.detail})

    def merge(self, other: FindingLog) -> None:
        for kind, count in other.counts.items():
            self.counts[kind] = self.counts.get(kind, 0) + count
        self.lines |= other.lines
        self.samples += other.samples[: max(0, self.max_samples - len(self.samples))]

    def to_dict(self) -> dict[str, Any]:
        return {"counts": dict(sorted(self.counts.items())), "examples_affected": len(self.lines),
                "first": self.samples}


@dataclass
class Histogram:
    edges: tuple[int, ...] = HISTOGRAM_EDGES
    counts: list[int] = field(default_factory=lambda: [0] * len(HISTOGRAM_EDGES))
    total: int = 0
    n: int = 0
    low: int | None = None
    high: int | None = None

    def add(self, value: int) -> None:
        self.counts[max(0, bisect_right(self.edges, value) - 1)] += 1
        self.total += value
        self.n += 1
        self.low = value if self.low is None else min(self.low, value)
        self.high = value if self.high is None else max(self.high, value)

    def add_many(self, values: list[int]) -> None:
        """`add` of every value, in a few numpy calls."""
        if not values:
            return
        array = np.asarray(values, dtype=np.int64)
        bins = np.maximum(np.searchsorted(np.asarray(self.edges), array, side="right") - 1, 0)
        added = np.bincount(bins, minlength=len(self.counts)).tolist()
        self.counts = [mine + more for mine, more in zip(self.counts, added)]
        self.total += int(array.sum())
        self.n += len(values)
        low, high = int(array.min()), int(array.max())
        self.low = low if self.low is None else min(self.low, low)
        self.high = high if self.high is None else max(self.high, high)

    def merge(self, other: Histogram) -> None:
        self.counts = [a + b for a, b in zip(self.counts, other.counts)]
        self.total += other.total
        self.n += other.n
        for value in (other.low, other.high):
            if value is not None:
                self.low = value if self.low is None else min(self.low, value)
                self.high = value if self.high is None else max(self.high, value)

    def to_dict(self) -> dict[str, Any]:
        bins = [f"{lo}-{hi - 1}" for lo, hi in zip(self.edges, self.edges[1:])] + [f"{self.edges[-1]}+"]
        return {"total": self.total, "count": self.n, "min": self.low, "max": self.high,
                "mean": round(self.total / self.n, 2) if self.n else None,
                "histogram": {b: c for b, c in zip(bins, self.counts) if c}}


@dataclass
class DatasetReport:
    data_format: str | None = None
    kind: str | None = None
    method: str = "supervised"
    num_rows: int = 0
    num_examples: int = 0
    errors: IssueLog = field(default_factory=IssueLog)
    warnings: IssueLog = field(default_factory=IssueLog)
    tokens: Histogram = field(default_factory=Histogram)
    turns: Histogram = field(default_factory=Histogram)
    roles: dict[str, int] = field(default_factory=dict)
    weights: dict[str, int] = field(default_factory=dict)
    truncated: int = 0
    removed_duplicates: int = 0
    duplicates: FindingLog = field(default_factory=FindingLog)
    contamination: FindingLog = field(default_factory=FindingLog)
    pii: FindingLog = field(default_factory=FindingLog)
    pii_policy: str = "warn"
    tokenizer: str | None = None
    max_seq_length: int | None = None

    @property
    def ok(self) -> bool:
        return not self.errors

    def merge(self, other: DatasetReport) -> None:
        """Add the report of a later part of the same file (see `data.parallel`)."""
        self.num_rows += other.num_rows
        self.num_examples += other.num_examples
        for mine, theirs in ((self.errors, other.errors), (self.warnings, other.warnings)):
            mine.merge(theirs)
        for mine_h, theirs_h in ((self.tokens, other.tokens), (self.turns, other.turns)):
            mine_h.merge(theirs_h)
        for mine_d, theirs_d in ((self.roles, other.roles), (self.weights, other.weights)):
            for key, count in theirs_d.items():
                mine_d[key] = mine_d.get(key, 0) + count
        self.truncated += other.truncated
        self.removed_duplicates += other.removed_duplicates
        for mine_f, theirs_f in ((self.duplicates, other.duplicates), (self.contamination, other.contamination),
                                 (self.pii, other.pii)):
            mine_f.merge(theirs_f)

    def summary(self, full_report: str | None = None) -> str:
        """One line for `status_details`: the first error, or nothing. `full_report`: the request
        that reads the whole report, as the tenant can send it (`GET /v1/files/file-abc/validation`)."""
        first = self.errors.first()
        if first is None:
            return ""
        where = f"line {first['line']}: " if first["line"] else ""
        more = sum(self.errors.counts.values()) - 1
        see = f"; see {full_report}" if full_report else ""
        tail = f" (and {more} more error(s){see})" if more else ""
        return f"{where}{first['message']} [{first['code']}]{tail}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "format": self.data_format,
            "kind": self.kind,
            "method": self.method,
            "num_rows": self.num_rows,
            "num_examples": self.num_examples,
            "errors": self.errors.to_dict(),
            "warnings": self.warnings.to_dict(),
            "tokens": {**self.tokens.to_dict(), "tokenizer": self.tokenizer,
                       "max_seq_length": self.max_seq_length, "truncated": self.truncated},
            "stats": {"turns": self.turns.to_dict(), "roles": dict(sorted(self.roles.items())),
                      "weights": dict(sorted(self.weights.items()))},
            "duplicates": {**self.duplicates.to_dict(), "removed": self.removed_duplicates},
            "contamination": self.contamination.to_dict(),
            "pii": {"policy": self.pii_policy, **self.pii.to_dict()},
        }
