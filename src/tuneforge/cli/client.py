"""Tenant commands, spoken over the API with the official openai SDK."""

from __future__ import annotations

import json
import os
import time
from typing import Any
from pathlib import Path

import openai
import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from tuneforge.settings import get_settings

console = Console(soft_wrap=True)  # one message, one line: scripts grep them
files_app = typer.Typer(help="Upload and list files.", no_args_is_help=True)
jobs_app = typer.Typer(help="Create and follow fine-tuning jobs.", no_args_is_help=True)
TERMINAL = ("succeeded", "failed", "cancelled")


def client() -> openai.OpenAI:
    api_key = os.environ.get("TUNEFORGE_API_KEY")
    if not api_key:
        console.print("[red]set TUNEFORGE_API_KEY to a tenant's API key[/red]")
        raise typer.Exit(code=2)
    base_url = os.environ.get("TUNEFORGE_BASE_URL") or get_settings().resolved_public_url
    return openai.OpenAI(base_url=base_url.rstrip("/") + "/v1", api_key=api_key, max_retries=2)


def _show(obj) -> None:  # noqa: ANN001
    console.print_json(json.dumps(obj.model_dump(), default=str))


@files_app.command("upload")
def files_upload(path: Path, purpose: str = typer.Option("fine-tune")) -> None:
    with open(path, "rb") as handle:
        created = client().files.create(file=handle, purpose=purpose)
    _show(created)


@files_app.command("list")
def files_list() -> None:
    for item in client().files.list():
        console.print(f"{item.id}  {item.filename}  {item.bytes} B  {item.status}")


@jobs_app.command("create")
def jobs_create(
    model: str = typer.Option(..., help="Base model name"),
    training_file: str = typer.Option(..., help="File id"),
    validation_file: str = typer.Option(None),
    suffix: str = typer.Option(None),
    method: str = typer.Option("supervised", help="Training method (docs/methods.md), e.g. supervised, dpo, kto"),
    hyperparameter: list[str] = typer.Option(
        [], "--hyperparameter", "-H", help="A hyperparameter of the method as NAME=VALUE (JSON value), repeatable"),
    n_epochs: int = typer.Option(None),
    batch_size: int = typer.Option(None),
    learning_rate: float = typer.Option(None),
    lora_rank: int = typer.Option(None),
    seed: int = typer.Option(None),
    idempotency_key: str = typer.Option(None),
) -> None:
    hp = {k: v for k, v in {"n_epochs": n_epochs, "batch_size": batch_size,
                            "learning_rate": learning_rate}.items() if v is not None}
    hp.update(_assignments(hyperparameter))
    extra_body = {"training_type": {"type": "lora", "rank": lora_rank}} if lora_rank else None
    job = client().fine_tuning.jobs.create(
        model=model, training_file=training_file, validation_file=validation_file or openai.NOT_GIVEN,
        suffix=suffix or openai.NOT_GIVEN, seed=seed if seed is not None else openai.NOT_GIVEN,
        method={"type": method, method: {"hyperparameters": hp}},
        extra_body=extra_body,
        extra_headers={"Idempotency-Key": idempotency_key} if idempotency_key else None,
    )
    _show(job)


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


@jobs_app.command("get")
def jobs_get(job_id: str) -> None:
    _show(client().fine_tuning.jobs.retrieve(job_id))


@jobs_app.command("list")
def jobs_list(limit: int = 20) -> None:
    for job in client().fine_tuning.jobs.list(limit=limit):
        console.print(f"{job.id}  {job.status:<16} {job.model}  {job.fine_tuned_model or ''}")


@jobs_app.command("cancel")
def jobs_cancel(job_id: str) -> None:
    _show(client().fine_tuning.jobs.cancel(job_id))


def _latest_metrics(api: openai.OpenAI, job_id: str) -> dict | None:
    for event in api.fine_tuning.jobs.list_events(job_id, limit=20).data:
        if event.type == "metrics" and event.data:
            return dict(event.data)
    return None


@jobs_app.command("watch")
def jobs_watch(job_id: str, interval_s: float = 1.0) -> None:
    """Live progress: step/total, loss, tokens/s, ETA; returns when the job ends."""
    api = client()
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
               TextColumn("{task.fields[stats]}"), TimeRemainingColumn())
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("queued", total=None, stats="")
        while True:
            job = api.fine_tuning.jobs.retrieve(job_id)
            metrics = _latest_metrics(api, job_id)
            if metrics:
                stats = f"loss {metrics.get('train_loss', float('nan')):.4f}  {metrics.get('tokens_per_second', 0):.0f} tok/s"
                progress.update(task, total=metrics.get("total_steps"), completed=metrics.get("step", 0), stats=stats)
            progress.update(task, description=job.status)
            if job.status in TERMINAL:
                break
            time.sleep(interval_s)
    console.print(f"{job.id}: {job.status}" + (f" -> {job.fine_tuned_model}" if job.fine_tuned_model else ""))
    if job.error and job.error.message:
        console.print(f"[red]{job.error.code}: {job.error.message}[/red]")
        raise typer.Exit(code=1)


def print_report(report: dict) -> None:
    """A validation report, readably: verdict, errors and warnings by code, stats."""
    from rich.table import Table

    verdict = "[green]ok[/green]" if report.get("ok") else "[red]invalid[/red]"
    console.print(f"{verdict}: {report.get('num_examples', 0)} examples of {report.get('num_rows', 0)} rows, "
                  f"format {report.get('format')}, shape {report.get('kind')}")
    for title, key, style in (("errors", "errors", "red"), ("warnings", "warnings", "yellow")):
        issues = report.get(key) or {}
        if not issues:
            continue
        table = Table("code", "count", "first lines", "first message", title=title, title_style=style)
        for code, item in issues.items():
            first = item.get("first") or []
            lines = ", ".join(str(i["line"]) for i in first[:8])
            table.add_row(code, str(item["count"]), lines, first[0]["message"] if first else "")
        console.print(table)
    tokens = report.get("tokens") or {}
    if tokens.get("count"):
        console.print(f"tokens: total {tokens['total']}, mean {tokens['mean']}, max {tokens['max']}, "
                      f"truncated {tokens.get('truncated', 0)}; histogram {tokens.get('histogram')}")
    for key in ("duplicates", "contamination", "pii"):
        section = report.get(key) or {}
        if section.get("counts"):
            console.print(f"{key}: {section['counts']} ({section.get('examples_affected', 0)} examples)")


@files_app.command("report")
def files_report(file_id: str, as_json: bool = typer.Option(False, "--json")) -> None:
    """The server's validation report of an uploaded file."""
    report = client().get(f"/files/{file_id}/validation", cast_to=object)
    if as_json:
        console.print_json(json.dumps(report))
    else:
        print_report(report)


@files_app.command("validate")
def files_validate(
    path: Path,
    model: str = typer.Option(None, help="A registered base model name, or a local model folder, for token checks"),
    method: str = typer.Option("supervised"),
    max_seq_length: int = typer.Option(None),
    data_format: str = typer.Option(None, "--format"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Run the platform's dataset checks locally, before uploading."""
    from tuneforge.data.pipeline import CheckOptions, check_dataset

    tokenizer = _local_tokenizer(model) if model else None
    options = CheckOptions(method=method, data_format=data_format, max_seq_length=max_seq_length
                           or (getattr(tokenizer, "model_max_length", None) if tokenizer else None))
    if options.max_seq_length and options.max_seq_length > 1 << 20:
        options.max_seq_length = None  # tokenizers without a limit report a huge sentinel
    report = check_dataset(path, options, tokenizer=tokenizer).to_dict()
    if as_json:
        console.print_json(json.dumps(report))
    else:
        print_report(report)
    raise typer.Exit(code=0 if report["ok"] else 1)


def _local_tokenizer(model: str):  # noqa: ANN202
    from transformers import AutoTokenizer

    if Path(model).is_dir():
        return AutoTokenizer.from_pretrained(model)
    from tuneforge.db.migrate import upgrade
    from tuneforge.db.repos import base_models
    from tuneforge.services.context import Platform
    from tuneforge.services.tokenizers import tokenizer_for
    from tuneforge.storage import layout

    settings = get_settings()
    upgrade(settings.resolved_database_url)
    platform = Platform.from_settings(settings)
    with platform.db.session() as session:
        row = base_models.by_name(session, model)
        if row is None:
            console.print(f"[red]no base model named {model!r} (give a registered name or a model folder)[/red]")
            raise typer.Exit(code=2)
        return tokenizer_for(platform.store, row, layout.home_base_model_cache_dir(settings.home))
