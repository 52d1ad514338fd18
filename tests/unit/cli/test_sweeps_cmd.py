"""`tuneforge sweeps`: a sweep file whose job names local files (uploaded first), then list, get
and cancel against a live server."""

from __future__ import annotations

import json

from tests.helpers.platform import chat_lines
from tests.unit.cli.test_resources import as_json, cli, live  # noqa: F401 - the live server fixture


def test_a_sweep_from_a_file_then_list_get_and_cancel(live, tmp_path):  # noqa: F811
    (tmp_path / "train.jsonl").write_bytes(chat_lines(20))
    (tmp_path / "valid.jsonl").write_bytes(chat_lines(10))
    (tmp_path / "sweep.yaml").write_text(
        "job:\n"
        "  model: tiny-base\n"
        "  training_file: file:train.jsonl\n"
        "  validation_file: file:valid.jsonl\n"
        "  method: {type: supervised, supervised: {hyperparameters: {n_epochs: 3}}}\n"
        "search_space:\n"
        "  learning_rate: {type: loguniform, low: 0.0001, high: 0.01}\n"
        "sampler: random\n"
        "max_trials: 3\n"
        "early_stopping: {type: asha, eta: 3}\n")
    sweep = as_json("sweeps", "create", "-f", str(tmp_path / "sweep.yaml"))
    assert sweep["status"] == "running" and sweep["sampler"] == "random" and sweep["max_trials"] == 3
    assert sweep["early_stopping"] == {"type": "asha", "min_epochs": 1.0, "eta": 3}
    assert sweep["objective"] == {"metric": "validation.loss", "goal": "minimize"}
    uploaded = {f.filename for f in live.sdk().files.list().data}
    assert {"train.jsonl", "valid.jsonl"} <= uploaded
    assert [s["id"] for s in as_json("sweeps", "list")["data"]] == [sweep["id"]]
    shown = cli("sweeps", "get", sweep["id"])
    assert sweep["id"] in shown.stdout and "validation.loss" in shown.stdout
    assert as_json("sweeps", "cancel", sweep["id"])["status"] == "cancelled"
    refused = cli("sweeps", "promote", sweep["id"], code=1)
    assert "has no best trial yet (it is cancelled)" in refused.stderr
    assert json.loads(cli("sweeps", "get", sweep["id"], "--json").stdout)["status"] == "cancelled"
