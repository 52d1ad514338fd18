"""Job files: a create body as YAML or JSON, the recipe and lockfile of a fine-tune in one.

    model: llama-3.2-1b
    training_file: file:data/train.jsonl      # a local file: uploaded when the job is created
    validation_file: file-abc123               # or a file already uploaded
    method:
      type: supervised
      supervised: {hyperparameters: {n_epochs: 3}}
    lock: {...}                                # written by `tuneforge jobs export`; checked by the server

`file:` paths are relative to the job file's folder. Fields that take a file: `training_file`,
`validation_file`, `eval.task_file`. A file the tenant already uploaded with the same bytes (same
SHA-256) is reused instead of uploaded again.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tuneforge.cli.api import EXIT_USAGE, CliFailure

FILE_PREFIX = "file:"


def load(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CliFailure(f"cannot read the job file {path}: {exc.strerror or exc}", EXIT_USAGE) from None
    try:
        body = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" (line {where.line + 1})" if where is not None else ""
        raise CliFailure(f"{path} is not valid {'JSON' if path.suffix.lower() == '.json' else 'YAML'}{line}",
                         EXIT_USAGE) from None
    if not isinstance(body, dict):
        raise CliFailure(f"{path} must hold one object (the job's create body)", EXIT_USAGE)
    return body


def upload_references(body: dict[str, Any], folder: Path, upload: Callable[[Path, str], str]) -> dict[str, Any]:
    """The body with each `file:PATH` replaced by the id `upload(path, purpose)` gives."""
    body = json.loads(json.dumps(body))  # a copy
    places: list[tuple[dict, str, str]] = [(body, "training_file", "fine-tune"), (body, "validation_file", "fine-tune")]
    if isinstance(body.get("eval"), dict):
        places.append((body["eval"], "task_file", "fine-tune"))
    for holder, key, purpose in places:
        value = holder.get(key)
        if isinstance(value, str) and value.startswith(FILE_PREFIX):
            path = Path(value[len(FILE_PREFIX):]).expanduser()
            path = path if path.is_absolute() else folder / path
            if not path.is_file():
                raise CliFailure(f"{key}: no such file {path}", EXIT_USAGE)
            holder[key] = upload(path, purpose)
    return body


def dump(body: dict[str, Any]) -> str:
    return yaml.safe_dump(body, sort_keys=False, allow_unicode=True)
