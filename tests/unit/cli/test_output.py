"""Tables print every id whole, on one line, at any terminal width: they can be copied."""

from __future__ import annotations

import pytest

from tests.helpers.cli import run
from tests.unit.cli.fake_api import ENV, serve

JOB = "ftjob-9Xw68S8EqLkT2mZpR4vBn7Yc"
JOB_2 = "ftjob-Ab3dEf6hIj9kLm2nOp5qRs8t"
FILE = "file-Qw7eRt9yUi2oPa4sDf6gHj8k"
MODEL = f"ft:tiny-base:acme:support-bot:{JOB}"
CHECKPOINT = f"{MODEL}:ckpt-step-40"
SWEEP = "sweep-Zx1cVb3nMq5wEr7tYu9iOp2a"
HOOK = "wh-Lk4jHg6fDs8aPo0iUy2tRe4w"
CREATED = 1764460800
ALL_IDS = (CHECKPOINT, MODEL, JOB, JOB_2, FILE, SWEEP, HOOK)

ANSWERS = {
    "/fine_tuning/jobs": {"object": "list", "has_more": False, "data": [
        {"id": JOB, "status": "succeeded", "model": "tiny-base", "fine_tuned_model": MODEL, "created_at": CREATED},
        {"id": JOB_2, "status": "running", "precise_status": "running", "model": MODEL, "fine_tuned_model": None,
         "created_at": CREATED}]},
    "/files": {"object": "list", "has_more": False, "data": [
        {"id": FILE, "filename": "a-rather-long-training-file-name-for-support.jsonl", "purpose": "fine-tune",
         "bytes": 123456, "status": "processed", "created_at": CREATED}]},
    f"/fine_tuning/jobs/{JOB}/checkpoints": {"object": "list", "has_more": False, "data": [
        {"step_number": 40, "fine_tuned_model_checkpoint": CHECKPOINT,
         "metrics": {"train_loss": 0.1234, "valid_loss": 0.2345}}]},
    "/models": {"object": "list", "data": [
        {"id": MODEL, "type": "fine-tuned", "stage": "staging", "base_model": "tiny-base", "created": CREATED},
        {"id": "tiny-base", "type": "base", "created": CREATED}]},
    "/webhooks": {"object": "list", "has_more": False, "data": [
        {"id": HOOK, "url": "https://hooks.example.com/a/rather/long/path/to/the/endpoint",
         "events": ["fine_tuning.job.succeeded", "fine_tuning.job.failed"]}]},
    "/fine_tuning/sweeps": {"object": "list", "data": [
        {"id": SWEEP, "status": "running", "trials": [], "stopped_early": 0, "best_trial": None,
         "created_at": CREATED}]},
    f"/fine_tuning/sweeps/{SWEEP}": {"id": SWEEP, "status": "running", "objective": {"goal": "minimize",
                                                                                    "metric": "valid_loss"},
                                     "trials": [{"number": 0, "params": {"learning_rate": 0.0002, "lora_rank": 16},
                                                 "status": "running", "objective": None, "gpu_seconds": 12.5,
                                                 "job_id": JOB}]},
    "/usage": {"object": "list", "data": [
        {"job_id": JOB, "model": MODEL, "status": "succeeded", "gpu_seconds": 120.0,
         "billable_gpu_seconds": 120.0, "refunded_gpu_seconds": 0.0}], "totals": {"gpu_seconds": 120.0}},
}

COMMANDS = [
    (("jobs", "list"), [JOB, JOB_2, MODEL]),
    (("files", "list"), [FILE]),
    (("jobs", "checkpoints", JOB), [CHECKPOINT]),
    (("models", "list"), [MODEL]),
    (("webhooks", "list"), [HOOK]),
    (("sweeps", "list"), [SWEEP]),
    (("sweeps", "get", SWEEP), [SWEEP, JOB]),
    (("usage",), [JOB, MODEL]),
]


@pytest.mark.parametrize("columns", [80, 100, 40])
@pytest.mark.parametrize("command, ids", COMMANDS, ids=[" ".join(c[:2]) for c, _ in COMMANDS])
def test_every_id_is_printed_whole_at_any_width(monkeypatch, command, ids, columns):
    serve(monkeypatch, ANSWERS)
    done = run(*command, env={**ENV, "COLUMNS": str(columns)})
    assert done.returncode == 0, done.stderr
    for shown_id in ids:
        assert shown_id in done.stdout, (columns, shown_id, done.stdout)
    assert "…" not in done.stdout
    # a line is only ever wider than the terminal by an id that is wider on its own
    wide = [line for line in done.stdout.splitlines() if len(line) > columns]
    assert all(any(i in line and len(line) - len(i) <= columns for i in ALL_IDS) for line in wide), done.stdout


def test_a_wide_terminal_gets_a_table_and_a_narrow_one_a_block_per_row(monkeypatch):
    serve(monkeypatch, ANSWERS)
    wide = run("jobs", "list", env={**ENV, "COLUMNS": "200"})
    assert wide.returncode == 0 and "┃ id" in wide.stdout
    assert any(JOB in line and MODEL in line for line in wide.stdout.splitlines())  # one row, one line
    narrow = run("jobs", "list", env={**ENV, "COLUMNS": "40"})
    assert narrow.returncode == 0 and "┃" not in narrow.stdout
    assert f"id: {JOB}\nstatus: succeeded\nmodel: tiny-base\nfine-tuned model: {MODEL}\n" in narrow.stdout
