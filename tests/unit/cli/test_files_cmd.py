"""`tuneforge files upload` of a file that fails validation, `jobs create -f` reusing a file already
uploaded with the same bytes, and the server's 400s as the CLI shows them."""

from __future__ import annotations

import json

import yaml

from tests.helpers.platform import chat_lines
from tests.unit.cli.test_resources import as_json, cli, live  # noqa: F401 - the live server fixture


def test_uploading_a_file_that_fails_validation_prints_the_report_and_exits_1(live, tmp_path):  # noqa: F811
    path = tmp_path / "bad.jsonl"
    path.write_bytes(chat_lines(3) + b'{"messages": [\n' + b'{"messages": "oops"}\n')
    done = cli("files", "upload", str(path), code=1)
    file_id = done.stdout.split("id: ")[1].split()[0]
    assert "status: error" in done.stdout and "invalid" in done.stdout  # the file, then its report
    assert "invalid_json" in done.stdout and "line 4" in done.stdout
    assert done.stderr.startswith(f"error: {file_id} failed validation: line 4:")
    assert f"see GET /v1/files/{file_id}/validation)" in done.stderr
    assert done.stderr.rstrip().endswith(f"(the whole report: tuneforge files report {file_id})")
    scripted = cli("files", "upload", str(path), "--json", code=1)
    assert json.loads(scripted.stdout)["status"] == "error"  # stdout: only the file object
    good = tmp_path / "good.jsonl"
    good.write_bytes(chat_lines(12))
    assert cli("files", "upload", str(good)).stderr == ""


def test_a_job_file_reuses_a_file_already_uploaded_with_the_same_bytes(live, tmp_path):  # noqa: F811
    (tmp_path / "train.jsonl").write_bytes(chat_lines(20))
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump({"model": "tiny-base", "training_file": "file:train.jsonl"}))
    first = cli("jobs", "create", "-f", str(job_file), "--json")
    training = json.loads(first.stdout)["training_file"]
    assert f"uploaded {tmp_path / 'train.jsonl'} as {training}" in first.stderr
    again = cli("jobs", "create", "-f", str(job_file), "--json")
    assert json.loads(again.stdout)["training_file"] == training
    assert f"reusing {training} for {tmp_path / 'train.jsonl'} (same content, uploaded 20" in again.stderr
    assert [f["id"] for f in as_json("files", "list")["data"]] == [training]  # one copy, not two
    (tmp_path / "train.jsonl").write_bytes(chat_lines(21))  # other bytes: a new upload
    changed = json.loads(cli("jobs", "create", "-f", str(job_file), "--json").stdout)["training_file"]
    assert changed != training and len(as_json("files", "list")["data"]) == 2


def test_a_mistyped_job_file_is_answered_with_what_was_meant(live, tmp_path):  # noqa: F811
    (tmp_path / "train.jsonl").write_bytes(chat_lines(20))
    job_file = tmp_path / "job.yaml"

    def refused(**body) -> str:
        job_file.write_text(yaml.safe_dump({"training_file": "file:train.jsonl", **body}))
        done = cli("jobs", "create", "-f", str(job_file), code=1)
        lines = done.stderr.splitlines()
        assert [line.startswith("error:") for line in lines] == [False] * (len(lines) - 1) + [True]
        return lines[-1]

    hyper = {"type": "supervised", "supervised": {"hyperparameters": {"epochs": 3}}}
    assert refused(model="tiny-base", method=hyper) == (
        "error: HTTP 400: Unknown parameter(s): method.supervised.hyperparameters.epochs (did you mean n_epochs?) "
        "(code unknown_parameter, field method.supervised.hyperparameters.epochs)")
    hyper["supervised"]["hyperparameters"] = {"n_epochs": "many"}
    assert refused(model="tiny-base", method=hyper) == (
        'error: HTTP 400: method.supervised.hyperparameters.n_epochs must be an integer or "auto", got "many" '
        "(code invalid_value, field method.supervised.hyperparameters.n_epochs)")
    assert refused(model="tiny-bas") == (
        "error: HTTP 400: Model 'tiny-bas' is not available for fine-tuning or does not exist; did you mean "
        "'tiny-base'? Base models: tiny-base (GET /v1/models lists them with your fine-tuned models) "
        "(code model_not_available, field model)")


def test_upload_waits_for_a_validation_that_goes_on_in_the_background(live, tmp_path):  # noqa: F811
    live.plane.platform.settings.upload_validate_wait_s = 0.0  # every upload answers processing
    good = tmp_path / "good.jsonl"
    good.write_bytes(chat_lines(300))
    shown = as_json("files", "upload", str(good))
    assert shown["status"] == "processed"
    assert shown["validation"] == {"rows_checked": 300, "bytes_checked": good.stat().st_size,
                                   "bytes_total": good.stat().st_size, "percent": 100.0}
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(chat_lines(5) + b'{"messages": "oops"}\n')
    done = cli("files", "upload", str(bad), code=1)
    file_id = done.stdout.split("id: ")[1].split()[0]
    assert "status: error" in done.stdout and "line 6" in done.stdout
    assert done.stderr.startswith(f"error: {file_id} failed validation: line 6:")
