"""The multi-process check gives the same report as the single-process one."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path
from typing import Any

import pytest

from tuneforge.data.contamination import ContaminationIndex
from tuneforge.data.limits import ReadLimits
from tuneforge.data.pipeline import CheckOptions, check_dataset

WORDS = "alpha beta gamma delta model train token layer value answer question data file line".split()
EVAL_ITEM = ("the quick brown fox jumps over the lazy dog while the model reads every line of the held out "
             "evaluation set twice")


def _chat(rng: random.Random, i: int) -> dict[str, Any]:
    question = " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 20)))
    answer = " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 40)))
    return {"messages": [{"role": "user", "content": f"{question} #{i}?"},
                         {"role": "assistant", "content": answer}]}


def _lines(rows: int, seed: int = 0) -> list[str]:
    """Chat rows with every kind of finding planted at known places."""
    rng = random.Random(seed)
    records: list[str] = []
    for i in range(rows):
        record = _chat(rng, i)
        if i % 97 == 5 and i > 10:
            record = json.loads(records[i - 7])  # exact duplicate of an earlier row
        elif i % 89 == 3:
            record["messages"][1]["content"] = "mail me at jane.doe@example.com or call +44 20 7946 0958"
        elif i % 83 == 7:
            records.append('{"messages": [ broken json')
            continue
        elif i % 79 == 2:
            record = {"messages": [{"role": "assistant", "content": "no user turn"}]}
        elif i % 71 == 4:
            record = {"prompt": "an instruction row", "completion": "in a chat file"}
        elif i % 67 == 6:
            record["messages"][1]["content"] = EVAL_ITEM
        elif i % 61 == 1:
            record["messages"][1]["content"] = " ".join(["long"] * 900)
        records.append(json.dumps(record))
    return records


def _write(path: Path, lines: list[str], compress: bool = False) -> Path:
    data = ("\n".join(lines) + "\n").encode()
    path.write_bytes(gzip.compress(data) if compress else data)
    return path


def _both(path: Path, tokenizer: Any, **options: Any) -> tuple[dict, dict]:
    index = ContaminationIndex()
    index.add_source("golden", [EVAL_ITEM])
    reports = []
    for workers in (1, 2):
        check = CheckOptions(max_seq_length=256, min_examples=1, batch_rows=128, workers=workers,
                             parallel_min_bytes=0, **options)
        reports.append(check_dataset(path, check, tokenizer=tokenizer, contamination=index).to_dict())
    return reports[0], reports[1]


def test_two_workers_report_exactly_what_one_process_reports(tmp_path: Path, tokenizer: Any) -> None:
    single, parallel = _both(_write(tmp_path / "data.jsonl", _lines(3000)), tokenizer)
    assert parallel == single
    # and the planted findings are really there (the comparison is not between two empty reports)
    assert single["num_rows"] == 3000
    broken = [i for i in range(3000) if i % 83 == 7 and not (i % 97 == 5 and i > 10)]
    assert single["errors"]["invalid_json"]["count"] == len(broken)
    assert [issue["line"] for issue in single["errors"]["invalid_json"]["first"]] == [i + 1 for i in broken][:20]
    assert single["errors"]["mixed_shapes"]["count"] > 0
    assert single["errors"]["role_order"]["count"] > 0
    assert single["duplicates"]["counts"]["exact_duplicate"] > 20
    assert single["pii"]["counts"]["pii:email"] > 20
    assert single["contamination"]["counts"]["contamination"] > 5
    assert single["tokens"]["truncated"] > 20
    assert single["tokens"]["count"] == single["num_examples"]


def test_gzipped_jsonl_and_the_example_cap(tmp_path: Path, tokenizer: Any) -> None:
    path = _write(tmp_path / "data.jsonl.gz", _lines(1500, seed=3), compress=True)
    single, parallel = _both(path, tokenizer)
    assert parallel == single
    single, parallel = _both(path, tokenizer, max_examples=500)
    assert parallel["errors"]["too_many_examples"]["count"] == 1
    assert single["errors"]["too_many_examples"]["count"] == 1
    assert parallel["errors"]["too_many_examples"]["first"][0]["line"] == \
        single["errors"]["too_many_examples"]["first"][0]["line"]


def test_a_line_over_the_limit_stops_reading_in_both(tmp_path: Path, tokenizer: Any) -> None:
    lines = _lines(1000, seed=4)
    lines[700] = json.dumps({"messages": [{"role": "user", "content": "x" * 10000},
                                          {"role": "assistant", "content": "y"}]})
    path = _write(tmp_path / "data.jsonl", lines)
    single, parallel = _both(path, tokenizer, limits=ReadLimits(max_line_bytes=8192))
    assert parallel == single
    assert single["errors"]["line_too_long"]["first"][0]["line"] == 701
    assert single["num_rows"] == 700


def test_a_file_without_valid_examples_up_front_falls_back(tmp_path: Path, tokenizer: Any) -> None:
    lines = ["not json"] * 2500 + _lines(300, seed=5)
    single, parallel = _both(_write(tmp_path / "data.jsonl", lines), tokenizer)
    assert parallel == single
    assert single["errors"]["invalid_json"]["count"] >= 2500


def test_a_worker_failure_is_an_error_not_a_hang(tmp_path: Path, tokenizer: Any,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from tuneforge.data import parallel

    path = _write(tmp_path / "data.jsonl", _lines(600, seed=6))
    monkeypatch.setattr(parallel.sys, "executable", "/bin/false")  # workers exit at once
    with pytest.raises(parallel.WorkerFailed):
        check_dataset(path, CheckOptions(min_examples=1, batch_rows=64, workers=2, parallel_min_bytes=0),
                      tokenizer=tokenizer)
