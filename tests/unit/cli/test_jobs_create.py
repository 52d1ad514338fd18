"""`tuneforge jobs create` for any registered method, hyperparameters given as NAME=VALUE."""

from __future__ import annotations

import io
import json

from typer.testing import CliRunner

from tests.unit.api.conftest import world  # noqa: F401 - the in-process API and its tenants
from tests.unit.train.test_kto import kto_lines
from tuneforge.cli import client as cli_client
from tuneforge.cli.main import app


def test_a_kto_job_from_the_cli_carries_its_method_hyperparameters(world, monkeypatch):  # noqa: F811
    sdk = world.sdk(world.key_a)
    lines = "".join(json.dumps(line) + "\n" for line in kto_lines(24, seed=4)).encode()
    training = sdk.files.create(file=("kto.jsonl", io.BytesIO(lines)), purpose="fine-tune")
    monkeypatch.setattr(cli_client, "client", lambda: sdk)
    done = CliRunner().invoke(app, ["jobs", "create", "--model", world.base_model, "--training-file", training.id,
                                    "--method", "kto", "-H", "beta=0.25", "-H", "undesirable_weight=1.5",
                                    "--n-epochs", "2"])
    assert done.exit_code == 0, done.output
    job = sdk.fine_tuning.jobs.list().data[0]
    request = sdk.fine_tuning.jobs.retrieve(job.id).model_dump()["method"]
    assert request["type"] == "kto"
    asked = request["kto"]["hyperparameters"]
    assert (asked["beta"], asked["undesirable_weight"], asked["n_epochs"]) == (0.25, 1.5, 2)


def test_a_bad_assignment_names_the_option(world, monkeypatch):  # noqa: F811
    monkeypatch.setattr(cli_client, "client", lambda: world.sdk(world.key_a))
    done = CliRunner().invoke(app, ["jobs", "create", "--model", world.base_model, "--training-file", "file-x",
                                    "-H", "beta"])
    assert done.exit_code != 0 and "NAME=VALUE" in done.output
