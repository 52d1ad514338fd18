"""`tuneforge jobs create` for any registered method, hyperparameters given as NAME=VALUE."""

from __future__ import annotations

import json

from tests.unit.cli.test_resources import as_json, cli, live  # noqa: F401 - the live server fixture
from tests.unit.train.test_kto import kto_lines


def test_a_kto_job_from_the_cli_carries_its_method_hyperparameters(live, tmp_path):  # noqa: F811
    path = tmp_path / "kto.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in kto_lines(24, seed=4)))
    training = as_json("files", "upload", str(path))
    job = as_json("jobs", "create", "--model", "tiny-base", "--training-file", training["id"], "--method", "kto",
                  "-H", "beta=0.25", "-H", "undesirable_weight=1.5", "--n-epochs", "2")
    request = live.sdk().fine_tuning.jobs.retrieve(job["id"]).model_dump()["method"]
    assert request["type"] == "kto"
    asked = request["kto"]["hyperparameters"]
    assert (asked["beta"], asked["undesirable_weight"], asked["n_epochs"]) == (0.25, 1.5, 2)


def test_a_bad_assignment_names_the_option(live):  # noqa: F811
    done = cli("jobs", "create", "--model", "tiny-base", "--training-file", "file-x", "-H", "beta", code=2)
    assert "NAME=VALUE" in done.stderr
