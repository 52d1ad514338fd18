"""Eval sets that training data is checked against for contamination:
platform-wide sets (registered by an admin under `eval-sets/`) and the
tenant's own files uploaded with purpose `evals`.

An `evals` file is checked when it is uploaded (`check_upload`): UTF-8 JSONL of at
most `MAX_EVALS_FILE_BYTES`, every line a chat example ending with an assistant turn
or a prompt/completion pair (what a task file of `eval.task_file` holds), and at most
`MAX_TENANT_EVAL_FILES` per tenant; anything else is a 400 naming the line. The index
of a tenant's sets holds at most `contamination.MAX_SOURCES`, and a set that cannot be
read (one stored before these checks) is left out with a warning: a tenant's later
uploads never fail because of it.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from tuneforge.data import formats, shapes
from tuneforge.data.contamination import MAX_SOURCES, ContaminationIndex
from tuneforge.data.example import DataIssue
from tuneforge.db.repos import files as file_repo
from tuneforge.domain.errors import ApiError, invalid
from tuneforge.services.datasets.checks import local_copy
from tuneforge.storage import layout
from tuneforge.storage.store import ObjectStore

_CACHE_SIZE = 16
MAX_EVALS_FILE_BYTES = 16 * 1024 * 1024  # every fine-tune upload is checked against all of them
MAX_TENANT_EVAL_FILES = 32  # a tenant's evals files; with the platform's sets, at most MAX_SOURCES
MAX_PLATFORM_EVAL_SETS = MAX_SOURCES - MAX_TENANT_EVAL_FILES
_READ_CHUNK_BYTES = 1 << 20
log = logging.getLogger(__name__)
_cache: OrderedDict[tuple, ContaminationIndex] = OrderedDict()
_lock = threading.Lock()


def _texts(path: Path, name: str) -> list[str]:
    """Every example's text; rows that do not parse are skipped (an eval file need not be training-shaped)."""
    texts = []
    for line, record in formats.iter_rows(path, None, name=name):
        if isinstance(record, DataIssue):
            continue
        try:
            example, _warnings = shapes.normalize(record, line)
        except DataIssue:
            continue
        texts.append(example.joined_text())
    return texts


def _sources(session: Session, store: ObjectStore, tenant_id: str) -> list[tuple[str, str, str]]:
    """(source name, object key, version) of every eval set that applies to the tenant: the
    platform's, then the tenant's newest files, `MAX_SOURCES` in all."""
    sources = []
    for key in store.list(layout.eval_sets_prefix()):
        name = key.split("/")[1]
        sources.append((f"platform:{name}", key, str(store.size_bytes(key))))
    rows = file_repo.newest_of_purpose(session, tenant_id, "evals", max(0, MAX_SOURCES - len(sources)))
    sources += [(f"file:{row.file_id}", row.key, row.sha256) for row in rows]
    return sources[:MAX_SOURCES]


def index_for(session: Session, store: ObjectStore, tenant_id: str) -> ContaminationIndex | None:
    sources = _sources(session, store, tenant_id)
    if not sources:
        return None
    cache_key = tuple(sources)
    with _lock:
        if cache_key in _cache:
            _cache.move_to_end(cache_key)
            return _cache[cache_key]
        index = ContaminationIndex()
        for name, key, _version in sources:
            try:
                with local_copy(store, key) as path:
                    texts = _texts(path, key.rsplit("/", 1)[-1])
            except Exception:  # noqa: BLE001 - a set that cannot be read must not fail the tenant's upload
                log.warning("eval set %s cannot be read; it is left out of the contamination check", name,
                            exc_info=True)
                continue
            index.add_source(name, texts)
        _cache[cache_key] = index
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
        return index


def check_upload(session: Session, store: ObjectStore, tenant_id: str, key: str) -> int:
    """An uploaded `evals` file (its bytes at `key`) as the platform takes it, or the 400 that
    names what is wrong (the line, for its content). Returns how many examples it holds."""
    count = file_repo.count_of_purpose(session, tenant_id, "evals")
    if count >= MAX_TENANT_EVAL_FILES:
        raise invalid(f"a tenant may keep at most {MAX_TENANT_EVAL_FILES} files with purpose 'evals'; delete one "
                      "first", param="purpose", code="too_many_eval_files")
    if store.size_bytes(key) > MAX_EVALS_FILE_BYTES:
        raise ApiError(413, f"an evals file may be at most {MAX_EVALS_FILE_BYTES} bytes", param="file",
                       code="file_too_large")
    examples = 0
    for number, line in _lines(store, key):
        if line.strip():
            _check_eval_line(line, number)
            examples += 1
    if not examples:
        raise invalid("the evals file holds no examples", param="file", code="empty_file")
    return examples


def _lines(store: ObjectStore, key: str):  # noqa: ANN202 - (line number, bytes) of a bounded file
    pending = b""
    number = 0
    with store.open_read(key) as handle:
        while chunk := handle.read(_READ_CHUNK_BYTES):
            *complete, pending = (pending + chunk).split(b"\n")
            for line in complete:
                number += 1
                yield number, line
    if pending:
        yield number + 1, pending


def _check_eval_line(line: bytes, number: int) -> None:
    """One line of an evals file: a JSON object shaped as a task example (the trainer's
    `train.eval_runner.task_examples` reads the same two shapes)."""
    where = f"line {number}"
    try:
        row: Any = json.loads(line.decode("utf-8-sig" if number == 1 else "utf-8"))
    except UnicodeDecodeError:
        raise invalid(f"{where}: an evals file must be UTF-8 JSONL text; this line is not UTF-8 (a binary file?)",
                      param="file", code="invalid_encoding") from None
    except ValueError as exc:
        raise invalid(f"{where}: not valid JSON ({str(exc)[:120]})", param="file", code="invalid_json") from None
    if not isinstance(row, dict):
        raise invalid(f"{where}: each line must be a JSON object", param="file", code="invalid_example")
    messages = row.get("messages")
    if isinstance(messages, list) and messages and all(isinstance(m, dict) for m in messages):
        if messages[-1].get("role") == "assistant" and all(isinstance(m.get("content"), (str, type(None)))
                                                            for m in messages):
            return
    elif isinstance(row.get("prompt"), str) and isinstance(row.get("completion"), str):
        return
    raise invalid(f"{where}: expected 'messages' (objects with text 'content') ending with an assistant turn, "
                  "or string 'prompt' and 'completion'", param="file", code="invalid_example")


def add_platform_eval_set(store: ObjectStore, name: str, path: Path) -> str:
    """Register a platform-wide eval set (admin); every tenant's data is checked against it."""
    if not path.is_file():
        raise invalid(f"{path} is not a file", param="path")
    if len(store.list(layout.eval_sets_prefix())) >= MAX_PLATFORM_EVAL_SETS:
        raise invalid(f"at most {MAX_PLATFORM_EVAL_SETS} platform eval sets (tenants keep up to "
                      f"{MAX_TENANT_EVAL_FILES} of their own)", param="name", code="too_many_eval_sets")
    texts = _texts(path, path.name)
    if not texts:
        raise invalid(f"{path} holds no readable examples", param="path")
    key = layout.eval_set_key(name, path.name)
    store.put_file(key, path)
    return key
