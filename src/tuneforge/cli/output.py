"""What the CLI prints: the server's JSON with `--json` (for scripts: stdout holds only that), or
a readable table or summary; progress bars and messages go to stderr."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn
from rich.table import Table

out = Console(soft_wrap=True, highlight=False)  # one message, one line: scripts grep them
err = Console(stderr=True, soft_wrap=True, highlight=False)

JSON = typer.Option(False, "--json", help="Print the server's JSON object (nothing else on stdout).")


def print_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, default=str))


def emit(value: Any, as_json: bool, human: Callable[[Any], None]) -> None:
    if as_json:
        print_json(value)
    else:
        human(value)


def table(rows: Iterable[dict], columns: Sequence[tuple[str, Callable[[dict], Any]]], title: str | None = None,
          empty: str = "none") -> None:
    shown = Table(*[name for name, _ in columns], title=title, title_justify="left")
    count = 0
    for row in rows:
        shown.add_row(*[_cell(get(row)) for _, get in columns])
        count += 1
    if count:
        out.print(shown)
    else:
        out.print(empty)


def fields(obj: dict, names: Sequence[str]) -> None:
    """`name: value` lines for the fields of `obj` that are set."""
    for name in names:
        value = obj.get(name)
        if value not in (None, "", [], {}):
            out.print(f"{name}: {_cell(value)}")


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value, default=str)
    return str(value)


def when(seconds: Any) -> str:
    if not isinstance(seconds, (int, float)):
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(seconds))


def transfer(description: str, total: int | None) -> Progress:
    """A bytes progress bar on stderr (hidden when stderr is not a terminal)."""
    progress = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                        TimeRemainingColumn(), console=err, transient=True)
    progress.add_task(description, total=total)
    return progress
