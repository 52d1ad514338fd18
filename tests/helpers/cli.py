"""Invoking the CLI in-process, stdout and stderr apart on every click release the package allows."""

from __future__ import annotations

import inspect

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
