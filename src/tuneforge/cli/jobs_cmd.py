"""`tuneforge jobs`: create (from options or a job file), list, get, pause, resume, cancel, follow
with a live loss line, events, checkpoints, attempts, download, export, estimate, report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from tuneforge.cli import jobfile, output
from tuneforge.cli.api import EXIT_USAGE, Api, CliFailure
from tuneforge.cli.files_cmd import download, print_report, upload_or_reuse
from tuneforge.cli.follow import follow_job
from tuneforge.cli.output import JSON, err, out

jobs_app = typer.Typer(help="Create, follow and manage fine-tuning jobs.", no_args_is_help=True)
TERMINAL = ("succeeded", "failed", "cancelled")


def _assignments(items: list[str]) -> dict[str, Any]:
    """NAME=VALUE pairs; a VALUE that parses as JSON (0.2, true, "auto") is taken as such, else as text."""
    values: dict[str, Any] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        if not sep or not name.strip():
            raise typer.BadParameter(f"expected NAME=VALUE, got {item!r}", param_hint="--hyperparameter")
        try:
            values[name.strip()] = json.loads(raw)
        except ValueError:
            values[name.strip()] = raw
    return values


def _body_from_options(model: str | None, training_file: str | None, validation_file: str | None,
                       suffix: str | None, method: str, hyperparameters: dict[str, Any], lora_rank: int | None,
                       training_type: str | None, seed: int | None) -> dict[str, Any]:
    if not model or not training_file:
        raise CliFailure("give --model and --training-file, or a job file with -f", EXIT_USAGE)
    body: dict[str, Any] = {"model": model, "training_file": training_file,
                            "method": {"type": method, method: {"hyperparameters": hyperparameters}}}
    for key, value in (("validation_file", validation_file), ("suffix", suffix), ("seed", seed)):
        if value is not None:
            body[key] = value
    if training_type or lora_rank:
        body["training_type"] = {"type": training_type or "lora", **({"rank": lora_rank} if lora_rank else {})}
    return body


def _show_job(job: dict) -> None:
    output.fields(job, ("id", "status", "model", "fine_tuned_model", "training_file", "validation_file", "seed",
                        "trained_tokens"))
    if job.get("precise_status") and job["precise_status"] != job.get("status"):
        out.print(f"precise_status: {job['precise_status']}")
    method = job.get("method") or {}
    hp = (method.get(method.get("type") or "", {}) or {}).get("hyperparameters")
    if hp:
        out.print(f"method: {method.get('type')} {json.dumps(hp)}")
    if job.get("error") and (job["error"] or {}).get("message"):
        out.print(f"[red]error: {job['error'].get('code')}: {job['error']['message']}[/red]")


@jobs_app.command("create")
def jobs_create(
    job_file: Path = typer.Option(None, "--file", "-f", help="A job file (YAML or JSON create body; `file:PATH` "
                                                             "values are uploaded first)."),
    model: str = typer.Option(None, help="Base model, or an ft: model / checkpoint to continue"),
    training_file: str = typer.Option(None, help="File id"),
    validation_file: str = typer.Option(None),
    suffix: str = typer.Option(None),
    method: str = typer.Option("supervised", help="Training method (docs/methods.md), e.g. supervised, dpo, kto"),
    hyperparameter: list[str] = typer.Option(
        [], "--hyperparameter", "-H", help="A hyperparameter of the method as NAME=VALUE (JSON value), repeatable"),
    n_epochs: int = typer.Option(None),
    batch_size: int = typer.Option(None),
    learning_rate: float = typer.Option(None),
    training_type: str = typer.Option(None, help="lora, qlora or full"),
    lora_rank: int = typer.Option(None),
    seed: int = typer.Option(None),
    idempotency_key: str = typer.Option(None),
    follow: bool = typer.Option(False, "--follow", help="Then follow it to the end (as `jobs follow`)."),
    as_json: bool = JSON,
) -> None:
    """Create a job from options, or from a job file (`-f job.yaml`)."""
    api = Api()
    if job_file is not None:
        body = jobfile.load(job_file)
        body = jobfile.upload_references(body, job_file.parent,
                                         lambda path, purpose: upload_or_reuse(api, path, purpose))
    else:
        hp = {k: v for k, v in {"n_epochs": n_epochs, "batch_size": batch_size,
                                "learning_rate": learning_rate}.items() if v is not None}
        hp.update(_assignments(hyperparameter))
        body = _body_from_options(model, training_file, validation_file, suffix, method, hp, lora_rank,
                                  training_type, seed)
    job = api.post("/fine_tuning/jobs", body,
                   headers={"Idempotency-Key": idempotency_key} if idempotency_key else None)
    output.emit(job, as_json, _show_job)
    if follow:
        follow_job(api, job["id"], quiet=as_json)


@jobs_app.command("estimate")
def jobs_estimate(job_file: Path = typer.Option(None, "--file", "-f"), model: str = typer.Option(None),
                  training_file: str = typer.Option(None), method: str = typer.Option("supervised"),
                  hyperparameter: list[str] = typer.Option([], "--hyperparameter", "-H"),
                  as_json: bool = JSON) -> None:
    """Tokens, steps, GPU-hours, price and queue position before creating the job."""
    api = Api()
    body = jobfile.load(job_file) if job_file is not None else _body_from_options(
        model, training_file, None, None, method, _assignments(hyperparameter), None, None, None)
    if job_file is not None:
        body = jobfile.upload_references(body, job_file.parent,
                                         lambda path, purpose: upload_or_reuse(api, path, purpose))
    output.emit(api.post("/fine_tuning/jobs/estimate", body), as_json,
                lambda shown: output.fields(shown, tuple(shown)))


@jobs_app.command("list")
def jobs_list(limit: int = typer.Option(20, min=1), status: str = typer.Option(None, help="Only jobs in this status"),
              metadata: list[str] = typer.Option([], "--metadata", help="KEY=VALUE, repeatable"),
              as_json: bool = JSON) -> None:
    filters = {f"metadata[{k}]": str(v) for k, v in _assignments(metadata).items()}
    jobs = [job for job in Api().pages("/fine_tuning/jobs", most=None if status else limit, page_size=100, **filters)
            if status is None or status in (job.get("status"), job.get("precise_status"))][:limit]
    output.emit({"object": "list", "data": jobs}, as_json, lambda _: output.table(jobs, [
        ("id", lambda j: j["id"]), ("status", lambda j: j.get("precise_status") or j.get("status")),
        output.id_column("model", lambda j: j.get("model")),
        output.id_column("fine-tuned model", lambda j: j.get("fine_tuned_model")),
        ("created (UTC)", lambda j: output.when(j.get("created_at")))], empty="no jobs"))


@jobs_app.command("get")
def jobs_get(job_id: str, as_json: bool = JSON) -> None:
    output.emit(Api().get(f"/fine_tuning/jobs/{job_id}"), as_json, _show_job)


def _action(verb: str):  # noqa: ANN202
    def command(job_id: str, as_json: bool = JSON) -> None:
        output.emit(Api().post(f"/fine_tuning/jobs/{job_id}/{verb}"), as_json, _show_job)

    command.__doc__ = {"cancel": "Cancel a job.", "pause": "Pause a running job (checkpointed; resume later).",
                       "resume": "Resume a paused job."}[verb]
    return command


for _verb in ("cancel", "pause", "resume"):
    jobs_app.command(_verb)(_action(_verb))


@jobs_app.command("events")
def jobs_events(job_id: str, limit: int = typer.Option(50, min=1), as_json: bool = JSON) -> None:
    """The job's events, newest first."""
    events = list(Api().pages(f"/fine_tuning/jobs/{job_id}/events", most=limit, page_size=min(limit, 100)))
    output.emit({"object": "list", "data": events}, as_json, lambda _: output.table(events, [
        ("time (UTC)", lambda e: output.when(e.get("created_at"))), ("level", lambda e: e.get("level")),
        ("message", lambda e: e.get("message"))], empty="no events"))


@jobs_app.command("checkpoints")
def jobs_checkpoints(job_id: str, as_json: bool = JSON) -> None:
    items = list(Api().pages(f"/fine_tuning/jobs/{job_id}/checkpoints"))
    output.emit({"object": "list", "data": items}, as_json, lambda _: output.table(items, [
        ("step", lambda c: c.get("step_number")),
        output.id_column("model", lambda c: c.get("fine_tuned_model_checkpoint")),
        ("train loss", lambda c: (c.get("metrics") or {}).get("train_loss")),
        ("valid loss", lambda c: (c.get("metrics") or {}).get("valid_loss"))], empty="no checkpoints"))


@jobs_app.command("attempts")
def jobs_attempts(job_id: str, as_json: bool = JSON) -> None:
    shown = Api().get(f"/fine_tuning/jobs/{job_id}/attempts")
    items = shown.get("data", [])
    output.emit(shown, as_json, lambda _: output.table(items, [
        (name, (lambda key: lambda a: a.get(key))(name)) for name in ("number", "status", "node", "exit_reason")
        if any(name in item for item in items)] or [("attempt", lambda a: a)], empty="no attempts"))


@jobs_app.command("report")
def jobs_report(job_id: str, as_json: bool = JSON) -> None:
    """The data report of the job's validation against its base model."""
    output.emit(Api().get(f"/fine_tuning/jobs/{job_id}/validation"), as_json, print_report)


@jobs_app.command("download")
def jobs_download(job_id: str,
                  artifact: str = typer.Option(None, help="adapter, model, merged, tensorboard or wandb"),
                  step: int = typer.Option(None, help="A checkpoint's step"),
                  dtype: str = typer.Option(None, help="With --artifact merged: bf16, fp16 or fp32"),
                  output_path: Path = typer.Option(None, "--output", "-o")) -> None:
    """The job's weights (or tracking files) as a .tar.gz, with a progress bar."""
    target = output_path or Path(f"{job_id}-{artifact or 'artifact'}{f'-step-{step}' if step else ''}.tar.gz")
    written = download(Api(), f"/fine_tuning/jobs/{job_id}/download", {"artifact": artifact, "step": step,
                                                                        "dtype": dtype}, target)
    err.print(f"wrote {target} ({written} bytes)")


@jobs_app.command("export")
def jobs_export(job_id: str, as_json: bool = JSON) -> None:
    """The create body that re-runs this job exactly, with its lock (base model and data SHA-256):
    `tuneforge jobs export ftjob-... > job.yaml`, then `tuneforge jobs create -f job.yaml`."""
    body = Api().get(f"/fine_tuning/jobs/{job_id}/export")
    if as_json:
        output.print_json(body)
    else:
        typer.echo(jobfile.dump(body), nl=False)


@jobs_app.command("follow")
def jobs_follow(job_id: str, as_json: bool = typer.Option(False, "--json", help="One JSON event per line.")) -> None:
    """Follow a job to its end: events as they happen and a live line of step, loss and speed. Exits 0 when
    it succeeds, 1 when it fails or is cancelled."""
    follow_job(Api(), job_id, quiet=False, as_json=as_json)


@jobs_app.command("watch", hidden=True)
def jobs_watch(job_id: str) -> None:
    """(The former name of `follow`.)"""
    follow_job(Api(), job_id, quiet=False)
