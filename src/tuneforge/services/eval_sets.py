"""Eval sets that training data is checked against for contamination:
platform-wide sets (registered by an admin under `eval-sets/`) and the
tenant's own files uploaded with purpose `evals`."""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from tuneforge.data import formats, shapes
from tuneforge.data.contamination import ContaminationIndex
from tuneforge.data.example import DataIssue
from tuneforge.db.tables import FileRow
from tuneforge.domain.errors import invalid
from tuneforge.services.datasets import local_copy
from tuneforge.storage import layout
from tuneforge.storage.store import ObjectStore

_CACHE_SIZE = 16
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
    """(source name, object key, version) of every eval set that applies to the tenant."""
    sources = []
    for key in store.list(layout.eval_sets_prefix()):
        name = key.split("/")[1]
        sources.append((f"platform:{name}", key, str(store.size_bytes(key))))
    rows = session.scalars(select(FileRow).where(FileRow.tenant_id == tenant_id, FileRow.purpose == "evals"))
    sources += [(f"file:{row.file_id}", row.key, row.sha256) for row in rows]
    return sources


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
            with local_copy(store, key) as path:
                index.add_source(name, _texts(path, key.rsplit("/", 1)[-1]))
        _cache[cache_key] = index
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
        return index


def add_platform_eval_set(store: ObjectStore, name: str, path: Path) -> str:
    """Register a platform-wide eval set (admin); every tenant's data is checked against it."""
    if not path.is_file():
        raise invalid(f"{path} is not a file", param="path")
    texts = _texts(path, path.name)
    if not texts:
        raise invalid(f"{path} holds no readable examples", param="path")
    key = layout.eval_set_key(name, path.name)
    store.put_file(key, path)
    return key
