"""Reading a W&B offline run file (`run-ID.wandb`) back, record by record.

The file is W&B's header (":W&B", a two-byte magic, a version byte) followed by a
LevelDB-style log: 32 KiB blocks of records, each a 7-byte header (CRC, length,
type: 1 whole, 2 first, 3 middle, 4 last) and its bytes; the pieces of a record
join into one protobuf `Record` of wandb's own schema.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_BLOCK = 32 * 1024
_HEADER = 7


def records(path: Path) -> Iterator[Any]:
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B" and data[4:6] == b"\xe1\xbe", data[:7]
    position, pieces = _HEADER, b""
    while position + _HEADER <= len(data):
        room = _BLOCK - position % _BLOCK
        if room < _HEADER:  # a block's tail too short for a header is padding
            position += room
            continue
        length, kind = struct.unpack("<HB", data[position + 4:position + _HEADER])
        if kind == 0:  # zero padding to the end of the block
            position += room
            continue
        body = data[position + _HEADER:position + _HEADER + length]
        position += _HEADER + length
        pieces = body if kind in (1, 2) else pieces + body
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pieces)
            yield record


def _key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)


def read_run(path: Path) -> dict[str, Any]:
    """The run's id, project, name, tags and config, its history (step -> metrics) and the last
    value of every summary key."""
    run: dict[str, Any] = {"history": {}, "summary": {}, "config": {}}
    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run.update(id=record.run.run_id, project=record.run.project, name=record.run.display_name,
                       tags=list(record.run.tags))
            run["config"].update({item.key: json.loads(item.value_json) for item in record.run.config.update})
        elif kind == "config":
            run["config"].update({_key(item): json.loads(item.value_json) for item in record.config.update})
        elif kind == "history":
            values = {_key(item): json.loads(item.value_json) for item in record.history.item}
            run["history"].setdefault(int(values["_step"]), {}).update(values)
        elif kind == "summary":
            run["summary"].update({_key(item): json.loads(item.value_json) for item in record.summary.update})
    return run
