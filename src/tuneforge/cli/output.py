"""What the CLI prints: the server's JSON with `--json` (for scripts: stdout holds only that), or
a readable table or summary; progress bars and messages go to stderr."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import typer
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn
from rich.table import Table
from rich.text import Text

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


class Column(NamedTuple):
    """A table column: its header, how a row gives its value, and whether that value is an id (printed
    whole on one line at any width, so it can be copied; the other columns wrap instead)."""

    name: str
    get: Callable[[dict], Any]
    is_id: bool = False


def id_column(name: str, get: Callable[[dict], Any]) -> Column:
    return Column(name, get, True)


# the narrowest a column beside the ids may get before the table gives way to one block per row
_NARROWEST_CELL = 6


def table(rows: Iterable[dict], columns: Sequence[tuple[str, Callable[[dict], Any]] | Column],
          title: str | None = None, empty: str = "none") -> None:
    """Rows as a table (a column named `id`, or made with `id_column`, is never cut); on a terminal
    too narrow for the ids and a little of each other column, `name: value` lines per row."""
    shown = [column if isinstance(column, Column) else Column(column[0], column[1], column[0] == "id")
             for column in columns]
    cells = [[_cell(column.get(row)) for column in shown] for row in rows]
    if not cells:
        out.print(empty)
        return
    id_widths = [max(len(column.name), *(len(line[i]) for line in cells)) if column.is_id else 0
                 for i, column in enumerate(shown)]
    # each column has a border and a space either side: 3 characters, and 1 for the last border
    needed = sum(id_widths) + sum(_NARROWEST_CELL for column in shown if not column.is_id) + 3 * len(shown) + 1
    if needed > out.width:
        _blocks(cells, shown, title)
        return
    grid = Table(title=title, title_justify="left")
    for column, width in zip(shown, id_widths, strict=True):
        if column.is_id:
            grid.add_column(column.name, no_wrap=True, min_width=width, overflow="fold")
        else:
            grid.add_column(column.name, overflow="fold")
    for line in cells:
        grid.add_row(*[Text(value) for value in line])
    out.print(grid)


def _blocks(cells: list[list[str]], columns: list[Column], title: str | None) -> None:
    if title:
        out.print(Text(title))
    for number, line in enumerate(cells):
        if number:
            out.print("")
        for column, value in zip(columns, line, strict=True):
            if value:  # an id stays on its line; any other value wraps
                out.print(Text(f"{column.name}: {value}"), soft_wrap=column.is_id)


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


class SilentProgress:
    """`transfer` where stderr is not a terminal: a bar that draws nothing at all (a disabled rich
    Progress still writes a blank line when it stops on some rich releases)."""

    task_ids = [0]

    def __enter__(self) -> SilentProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, task: int, **changes: Any) -> None:
        return None

    def advance(self, task: int, advance: float = 1) -> None:
        return None


def transfer(description: str, total: int | None) -> Progress | SilentProgress:
    """A bytes progress bar on stderr (nothing when stderr is not a terminal)."""
    if not err.is_terminal:
        return SilentProgress()
    progress = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                        TimeRemainingColumn(), console=err, transient=True)
    progress.add_task(description, total=total)
    return progress
