"""Invoking the CLI in-process, stdout and stderr apart on every click release the package allows."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass

from click.testing import Result
from typer.testing import CliRunner

from tuneforge.cli.main import app


def runner() -> CliRunner:
    # click < 8.2 mixes stderr into stdout unless told not to; 8.2 on always keeps them apart
    if "mix_stderr" in inspect.signature(CliRunner.__init__).parameters:
        return CliRunner(mix_stderr=False)
    return CliRunner()


def invoke(*args: str, input: str | None = None) -> Result:  # noqa: A002
    return runner().invoke(app, list(args), input=input)


@dataclass(frozen=True)
class Done:
    """An in-process command's outcome, shaped like `subprocess.CompletedProcess`."""

    returncode: int
    stdout: str
    stderr: str


def run(*args: str, env: Mapping[str, str | None]) -> Done:
    """The command line, in this process, with `env` set for the call (as a separate process
    would see it; a name mapped to None is unset for it): what it printed apart on each stream,
    and its exit code."""
    from tuneforge.settings import get_settings

    get_settings.cache_clear()  # the command reads its settings from `env`, as a new process would
    try:
        result = runner().invoke(app, list(args), env=env)
    finally:
        get_settings.cache_clear()
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return Done(result.exit_code, result.stdout, result.stderr)
