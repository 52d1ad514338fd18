"""structure: a whole file read once, issues capped per code, examples streamed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tuneforge import methods
from tuneforge.data.limits import ReadLimits
from tuneforge.data.structure import StructureReport, iter_examples, validate_structure

CHAT = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}
BAD_WEIGHT = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "x", "weight": 3}]}


def jsonl(tmp_path: Path, rows: list[Any], name: str = "a.jsonl") -> Path:
    path = tmp_path / name
    path.write_bytes(b"".join(json.dumps(row).encode() + b"\n" for row in rows))
    return path


def test_issues_are_capped_per_code_but_all_counted(tmp_path: Path) -> None:
    path = jsonl(tmp_path, [CHAT] + [BAD_WEIGHT] * 30 + [{"prompt": "a", "completion": "b"}] * 3)
    report = validate_structure(path, max_issues_per_code=5)
    assert (report.num_rows, report.num_examples, report.num_errors) == (34, 1, 33)
    assert report.counts == {"invalid_weight": 30, "mixed_shapes": 3}
    assert [issue.line for issue in report.errors()] == [2, 3, 4, 5, 6, 32, 33, 34]
    first = report.first_error()
    assert first is not None and (first.code, first.line, first.field) == ("invalid_weight", 2, "messages[1].weight")
    assert not report.ok


def test_examples_stream_while_the_report_fills(tmp_path: Path) -> None:
    path = jsonl(tmp_path, [CHAT, BAD_WEIGHT, CHAT])
    report = StructureReport()
    examples = iter_examples(path, method=methods.get("supervised").fit, report=report)
    first = next(examples)
    assert (first.line, first.kind, report.num_rows, report.issues) == (1, "chat", 1, [])
    assert [example.line for example in examples] == [3]
    assert report.counts == {"invalid_weight": 1}


def test_warnings_do_not_fail_the_file(tmp_path: Path) -> None:
    empty_user = {"messages": [{"role": "user", "content": ""}, {"role": "assistant", "content": "Hello"}]}
    report = validate_structure(jsonl(tmp_path, [empty_user]), method=methods.get("supervised").fit)
    assert report.ok and report.num_examples == 1
    assert [(w.code, w.line) for w in report.warnings()] == [("empty_turn", 1)]


def test_shape_mismatch_is_reported_once_at_the_first_example(tmp_path: Path) -> None:
    report = validate_structure(jsonl(tmp_path, [CHAT] * 3), method=methods.get("cpt").fit)
    assert report.counts == {"shape_mismatch": 1}
    assert report.errors()[0].line == 1


def test_too_few_examples_and_file_level_issues(tmp_path: Path) -> None:
    report = validate_structure(jsonl(tmp_path, [CHAT] * 3), min_examples=10)
    assert [(i.code, i.line) for i in report.errors()] == [("too_few_examples", 0)]
    (tmp_path / "empty.jsonl").write_bytes(b"")
    report = validate_structure(tmp_path / "empty.jsonl")
    assert (report.format, report.counts) == (None, {"empty_file": 1})


def test_a_file_level_issue_after_good_rows_keeps_them_counted(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_bytes(json.dumps(CHAT).encode() + b"\n" + b'{"text": "' + b"x" * 5000 + b'"}\n')
    report = validate_structure(path, limits=ReadLimits(max_line_bytes=1000))
    assert (report.num_examples, [(i.code, i.line) for i in report.errors()]) == (1, [("line_too_long", 2)])


def test_report_as_dict(tmp_path: Path) -> None:
    report = validate_structure(jsonl(tmp_path, [CHAT, BAD_WEIGHT]), method=methods.get("supervised").fit)
    as_dict = report.to_dict()
    assert as_dict["format"] == "jsonl" and as_dict["kind"] == "chat"
    assert as_dict["issues"][0] == {"code": "invalid_weight", "message": "messages[1].weight must be 0 or 1",
                                    "line": 2, "field": "messages[1].weight", "excerpt": "3", "severity": "error"}
