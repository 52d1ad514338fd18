"""Structural validation of a whole dataset: every row read, recognised and normalised.

`iter_examples` streams the valid `Example`s of a file while it fills a
`StructureReport` with every issue met on the way (the first
`max_issues_per_code` of each code are kept, all are counted), so later
stages (dedup, PII, contamination, tokenization) can run in the same pass.
`validate_structure` runs it to the end and returns the report alone.

Beyond single rows it checks the file as a whole: one kind of example per
file (`mixed_shapes`), a kind the training method accepts (`shape_mismatch`),
and enough examples (`too_few_examples`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuneforge.data.example import DataIssue, Example
from tuneforge.data.formats import iter_rows, resolve_format
from tuneforge.data.limits import DEFAULT_LIMITS, ReadLimits
from tuneforge.data.shapes import (
    MethodFit,
    check_method,
    check_required_fields,
    normalize,
    plain_chat,
    skipped_kinds,
)

DEFAULT_MAX_ISSUES_PER_CODE = 20


@dataclass
class StructureReport:
    """What reading one dataset found. `issues` are in the order they were met."""

    format: str | None = None
    kind: str | None = None
    num_rows: int = 0  # rows read, good or bad
    num_examples: int = 0  # rows that became valid examples of the file's kind
    issues: list[DataIssue] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)  # every issue met, by code
    max_issues_per_code: int = DEFAULT_MAX_ISSUES_PER_CODE
    num_errors: int = 0
    kind_line: int = 0  # the example that set `kind`

    @property
    def ok(self) -> bool:
        return self.num_errors == 0

    def add(self, issue: DataIssue) -> None:
        seen = self.counts.get(issue.code, 0)
        self.counts[issue.code] = seen + 1
        if issue.severity == "error":
            self.num_errors += 1
        if seen < self.max_issues_per_code:
            self.issues.append(issue)

    def errors(self) -> list[DataIssue]:
        return [issue for issue in self.issues if issue.severity == "error"]

    def warnings(self) -> list[DataIssue]:
        return [issue for issue in self.issues if issue.severity == "warning"]

    def first_error(self) -> DataIssue | None:
        return next((issue for issue in self.issues if issue.severity == "error"), None)

    def to_dict(self) -> dict[str, Any]:
        return {"format": self.format, "kind": self.kind, "num_rows": self.num_rows,
                "num_examples": self.num_examples, "num_errors": self.num_errors, "counts": dict(self.counts),
                "issues": [issue.to_dict() for issue in self.issues]}


def iter_examples(
    path: Path,
    fmt: str | None = None,
    method: MethodFit | None = None,
    *,
    report: StructureReport,
    limits: ReadLimits = DEFAULT_LIMITS,
    name: str | None = None,
    min_examples: int = 1,
) -> Iterator[Example]:
    """Every valid example of the dataset at `path`, while `report` collects the issues.

    `method` (what a training method trains on: `tuneforge.methods.get(name).fit`) adds the `shape_mismatch` check.
    The report is complete once the iterator is exhausted.
    """
    try:
        report.format = resolve_format(Path(path), fmt, name=name)
        for line, item in iter_rows(Path(path), report.format, limits=limits, name=name):
            report.num_rows += 1
            if isinstance(item, DataIssue):
                report.add(item)
                continue
            example = _normalized(item, line, report, method)
            if example is not None:
                report.num_examples += 1
                yield example
    except DataIssue as issue:  # the file as a whole: reading stops here
        report.add(issue)
        return
    if report.num_rows and report.ok and report.num_examples < min_examples:
        report.add(DataIssue("too_few_examples", f"{report.num_examples} valid examples; at least {min_examples} "
                             "are required"))


def _normalized(record: dict[str, Any], line: int, report: StructureReport,
                method: MethodFit | None) -> Example | None:
    example = plain_chat(record, line)
    if example is None:
        try:
            example, warnings = normalize(record, line, skipped_kinds(method, report.kind))
        except DataIssue as issue:
            report.add(issue)
            return None
        for warning in warnings:
            report.add(warning)
    if report.kind is None:
        report.kind, report.kind_line = example.kind, line
        if method is not None:
            try:
                check_method(example.kind, method, line)
            except DataIssue as issue:
                report.add(issue)
    elif example.kind != report.kind:
        report.add(DataIssue("mixed_shapes", f"{_with_article(example.kind)} example in a file of {report.kind} "
                             f"examples (line {report.kind_line}); one file holds one kind", line=line))
        return None
    if method is not None and method.required_fields:
        try:
            check_required_fields(example, method)
        except DataIssue as issue:
            report.add(issue)
            return None
    return example


def _with_article(kind: str) -> str:
    return f"an {kind}" if kind[0] in "aeiou" else f"a {kind}"


def validate_structure(
    path: Path,
    fmt: str | None = None,
    method: MethodFit | None = None,
    *,
    limits: ReadLimits = DEFAULT_LIMITS,
    name: str | None = None,
    max_issues_per_code: int = DEFAULT_MAX_ISSUES_PER_CODE,
    min_examples: int = 1,
) -> StructureReport:
    """Read the whole dataset at `path` and report every structural issue (examples are not kept)."""
    report = StructureReport(max_issues_per_code=max_issues_per_code)
    for _ in iter_examples(path, fmt, method, report=report, limits=limits, name=name, min_examples=min_examples):
        pass
    return report
