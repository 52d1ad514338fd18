"""`tuneforge files`: upload (with progress), list, get, delete, download, the server's validation
report, a preview of the loss mask, and the platform's checks run locally before uploading."""

from __future__ import annotations

import time
from pathlib import Path
from typing import IO, Any

import typer

from tuneforge.cli import output
from tuneforge.cli.api import EXIT_INVALID_DATA, EXIT_USAGE, Api, CliFailure
from tuneforge.cli.output import JSON, err, out
from tuneforge.domain.digests import file_sha256

files_app = typer.Typer(help="Upload, list, inspect and download files.", no_args_is_help=True)


class _Counted:
    """A file read in chunks that moves a progress bar."""

    def __init__(self, handle: IO[bytes], advance) -> None:  # noqa: ANN001
        self.handle, self.advance = handle, advance

    def read(self, size: int = -1) -> bytes:
        chunk = self.handle.read(size)
        self.advance(len(chunk))
        return chunk

    def __getattr__(self, name: str) -> Any:
        return getattr(self.handle, name)


def upload_file(api: Api, path: Path, purpose: str = "fine-tune", *, quiet: bool = False) -> dict:
    """Upload `path` (streamed, with a progress bar on stderr); the File object."""
    if not path.is_file():
        raise CliFailure(f"no such file: {path}", EXIT_USAGE)
    size = path.stat().st_size
    with output.transfer(f"uploading {path.name}", size) as progress, path.open("rb") as handle:
        task = progress.task_ids[0]
        if quiet:
            progress.update(task, visible=False)
        counted = _Counted(handle, lambda n: progress.advance(task, n))
        return api.upload("/files", counted, path.name, {"purpose": purpose})


def wait_processed(api: Api, created: dict, *, quiet: bool = False, poll_s: float = 0.5) -> dict:
    """The File object once its validation has ended: a fine-tune file is validated in the background
    and answers `processing` until then. A bar of the bytes checked is drawn on a terminal."""
    item = created
    if item.get("status") != "processing":
        return item
    with output.transfer(f"validating {item.get('filename', item['id'])}",
                         _checked(item).get("bytes_total") or item.get("bytes")) as progress:
        task = progress.task_ids[0]
        if quiet:
            progress.update(task, visible=False)
        while item.get("status") == "processing":
            time.sleep(poll_s)
            item = api.get(f"/files/{item['id']}")
            progress.update(task, completed=_checked(item).get("bytes_checked") or 0)
    return item


def _checked(item: dict) -> dict:
    return item.get("validation") or {}


def uploaded_copy(api: Api, path: Path, purpose: str) -> dict | None:
    """The newest of the tenant's files with the bytes of `path` (by SHA-256 and size) and `purpose`
    that did not fail validation, if there is one."""
    size, digest = path.stat().st_size, file_sha256(path)
    for item in api.pages("/files", purpose=purpose, page_size=1000):
        if item.get("sha256") == digest and item.get("bytes") == size and item.get("status") != "error":
            return item
    return None


def upload_or_reuse(api: Api, path: Path, purpose: str = "fine-tune") -> str:
    """The id of a file with the bytes of `path`: one already uploaded (said on stderr), else a new upload."""
    if not path.is_file():
        raise CliFailure(f"no such file: {path}", EXIT_USAGE)
    same = uploaded_copy(api, path, purpose)
    if same is not None:
        when = output.when(same.get("created_at"))
        err.print(f"reusing {same['id']} for {path} (same content, uploaded {when} UTC)", markup=False)
        wait_processed(api, same)  # a copy still being validated: a sweep needs it processed
        return str(same["id"])
    created = wait_processed(api, upload_file(api, path, purpose))
    err.print(f"uploaded {path} as {created['id']}", markup=False)
    if created.get("status") == "error":
        err.print(f"{created['id']} failed validation: {created.get('status_details')}", markup=False)
    return str(created["id"])


def _show_file(item: dict) -> None:
    output.fields(item, ("id", "filename", "purpose", "bytes", "status", "status_details"))
    if item.get("created_at"):
        out.print(f"created: {output.when(item['created_at'])} UTC")


@files_app.command("upload")
def files_upload(path: Path, purpose: str = typer.Option("fine-tune"), as_json: bool = JSON) -> None:
    """Upload a file (validated by the server when its purpose is fine-tune: waits for the validation,
    with its progress on a terminal)."""
    api = Api()
    created = wait_processed(api, upload_file(api, path, purpose))
    output.emit(created, as_json, _show_file)
    if created.get("status") == "error":
        if not as_json:
            print_report(api.get(f"/files/{created['id']}/validation"))
        raise CliFailure(f"{created['id']} failed validation: {created.get('status_details')} (the whole report: "
                         f"tuneforge files report {created['id']})", EXIT_INVALID_DATA)


@files_app.command("list")
def files_list(purpose: str = typer.Option(None), limit: int = typer.Option(100, min=1), as_json: bool = JSON) -> None:
    items = list(Api().pages("/files", most=limit, purpose=purpose))
    output.emit({"object": "list", "data": items}, as_json, lambda _: output.table(items, [
        ("id", lambda f: f["id"]), ("filename", lambda f: f.get("filename")), ("purpose", lambda f: f.get("purpose")),
        ("bytes", lambda f: f.get("bytes")), ("status", lambda f: f.get("status")),
        ("created (UTC)", lambda f: output.when(f.get("created_at")))], empty="no files"))


@files_app.command("get")
def files_get(file_id: str, as_json: bool = JSON) -> None:
    output.emit(Api().get(f"/files/{file_id}"), as_json, _show_file)


@files_app.command("delete")
def files_delete(file_id: str, as_json: bool = JSON) -> None:
    output.emit(Api().delete(f"/files/{file_id}"), as_json, lambda d: out.print(f"deleted {d.get('id', file_id)}"))


@files_app.command("download")
def files_download(file_id: str, output_path: Path = typer.Option(None, "--output", "-o",
                                                                  help="Where to write it "
                                                                       "(default: its filename).")) -> None:
    """A file's bytes, with a progress bar."""
    api = Api()
    meta = api.get(f"/files/{file_id}")
    target = output_path or Path(Path(meta.get("filename") or file_id).name)
    download(api, f"/files/{file_id}/content", None, target, meta.get("bytes"))
    err.print(f"wrote {target}")


def download(api: Api, path: str, params: dict | None, target: Path, size: int | None = None) -> int:
    """Stream `path` to `target` (written beside it, then renamed), with a progress bar; bytes written."""
    partial = target.with_name(target.name + ".partial")
    written = 0
    with api.stream("GET", path, params=params) as response:
        total = size or int(response.headers.get("content-length") or 0) or None
        with output.transfer(f"downloading {target.name}", total) as progress, partial.open("wb") as handle:
            for chunk in response.iter_bytes(1 << 20):
                handle.write(chunk)
                written += len(chunk)
                progress.advance(progress.task_ids[0], len(chunk))
    partial.replace(target)
    return written


@files_app.command("report")
def files_report(file_id: str, as_json: bool = JSON) -> None:
    """The server's validation report of an uploaded file."""
    output.emit(Api().get(f"/files/{file_id}/validation"), as_json, print_report)


@files_app.command("preview")
def files_preview(file_id: str, model: str = typer.Option(..., help="Base model whose chat template renders them"),
                  limit: int = typer.Option(2, min=1, max=10), as_json: bool = JSON) -> None:
    """The first examples as the trainer sees them; the tokens that carry loss are underlined."""
    shown = Api().get(f"/files/{file_id}/preview", model=model, limit=limit)
    output.emit(shown, as_json, _print_preview)


def _print_preview(shown: dict) -> None:
    from rich.text import Text

    for example in shown["examples"]:
        out.print(f"[bold]line {example['line']}[/bold]: {example['num_tokens']} tokens, "
                  f"{example['num_trained_tokens']} trained (underlined)")
        if example.get("error"):
            out.print(f"  {example['error']['message']}")
            continue
        text = Text()
        for token in example["tokens"]:
            text.append(token["text"], style="underline green" if token["trained"] else "dim")
        out.print(text)


def print_report(report: dict) -> None:
    """A validation report, readably: verdict, errors and warnings by code, stats."""
    from rich.table import Table

    verdict = "[green]ok[/green]" if report.get("ok") else "[red]invalid[/red]"
    out.print(f"{verdict}: {report.get('num_examples', 0)} examples of {report.get('num_rows', 0)} rows, "
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
        out.print(table)
    tokens = report.get("tokens") or {}
    if tokens.get("count"):
        out.print(f"tokens: total {tokens['total']}, mean {tokens['mean']}, max {tokens['max']}, "
                  f"truncated {tokens.get('truncated', 0)}; histogram {tokens.get('histogram')}")
    for key in ("duplicates", "contamination", "pii"):
        section = report.get(key) or {}
        if section.get("counts"):
            out.print(f"{key}: {section['counts']} ({section.get('examples_affected', 0)} examples)")


@files_app.command("validate")
def files_validate(
    path: Path,
    model: str = typer.Option(None, help="A registered base model name, or a local model folder, for token checks"),
    method: str = typer.Option("supervised"),
    max_seq_length: int = typer.Option(None),
    data_format: str = typer.Option(None, "--format"),
    as_json: bool = JSON,
) -> None:
    """Run the platform's dataset checks locally, before uploading (needs tuneforge[server])."""
    from tuneforge import methods
    from tuneforge.data.pipeline import CheckOptions, check_dataset
    from tuneforge.domain.errors import ApiError

    try:
        fit = methods.get(method).fit
    except ApiError as exc:
        err.print(f"--method: {exc.message}", markup=False)
        raise typer.Exit(code=EXIT_USAGE) from None
    tokenizer = _local_tokenizer(model) if model else None
    options = CheckOptions(method=fit, data_format=data_format, max_seq_length=max_seq_length
                           or (getattr(tokenizer, "model_max_length", None) if tokenizer else None))
    if options.max_seq_length and options.max_seq_length > 1 << 20:
        options.max_seq_length = None  # tokenizers without a limit report a huge sentinel
    report = check_dataset(path, options, tokenizer=tokenizer).to_dict()
    output.emit(report, as_json, print_report)
    raise typer.Exit(code=0 if report["ok"] else EXIT_INVALID_DATA)


def _local_tokenizer(model: str):  # noqa: ANN202
    from transformers import AutoTokenizer

    if Path(model).is_dir():
        return AutoTokenizer.from_pretrained(model)
    from tuneforge.cli.admin import platform as open_platform
    from tuneforge.db.repos import base_models
    from tuneforge.services.datasets.tokenizers import tokenizer_for
    from tuneforge.storage import layout

    platform = open_platform()
    settings = platform.settings
    with platform.db.session() as session:
        row = base_models.by_name(session, model)
        if row is None:
            raise CliFailure(f"no base model named {model!r} (give a registered name or a model folder)", EXIT_USAGE)
        return tokenizer_for(platform.store, row, layout.home_base_model_cache_dir(settings.home))
