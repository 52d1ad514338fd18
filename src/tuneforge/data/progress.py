"""How far a dataset check has got, told to a process that waits for it.

An upload's check runs in a worker process (`data.isolation`) while the control plane shows its
progress, so the progress crosses a process boundary: `check_with_progress` runs `check_dataset`
with a thread beside it that writes a small JSON file every `interval_s` — rows read so far (the
pass's `StructureReport.num_rows`, handed over by the pipeline's `watch` hook) and bytes read so
far (the offset of the worker's open descriptors on the checked file, from /proc/self/fdinfo: no
reader has to count). The file is written under a temporary name and renamed, so `read_progress`
never sees half of one. Where /proc is missing the bytes stay unknown until the end.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from tuneforge.data.contamination import ContaminationIndex
from tuneforge.data.pipeline import CheckOptions, check_dataset
from tuneforge.data.report import DatasetReport
from tuneforge.data.structure import StructureReport

DEFAULT_INTERVAL_S = 0.5
_FD_DIR = Path("/proc/self/fd")


def check_with_progress(path: Path, options: CheckOptions, progress_path: Path, *, name: str | None = None,
                        contamination: ContaminationIndex | None = None,
                        interval_s: float = DEFAULT_INTERVAL_S) -> DatasetReport:
    """`check_dataset(path, options)`, writing its progress to `progress_path` as it goes and once
    more, complete, at the end."""
    writer = ProgressWriter(Path(path), Path(progress_path), interval_s)
    writer.start()
    try:
        report = check_dataset(path, options, name=name, contamination=contamination, watch=writer.watch)
    finally:
        writer.stop()
    writer.write(finished=True)
    return report


class ProgressWriter:
    def __init__(self, checked: Path, out: Path, interval_s: float) -> None:
        self._checked = checked
        self._out = out
        self._interval_s = interval_s
        self._structure: StructureReport | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tuneforge-check-progress", daemon=True)
        self.bytes_total = _size_bytes(checked)
        self._bytes_seen = 0
        self._targets = {str(p.resolve()) for p in _files_of(checked)}

    def watch(self, structure: StructureReport) -> None:
        self._structure = structure

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.write()
            except OSError:  # the waiting side removed the folder: it no longer reads
                return

    def snapshot(self, finished: bool = False) -> dict[str, Any]:
        structure = self._structure
        rows = structure.num_rows if structure is not None else 0
        position = _read_position(self._targets)
        if position is not None:
            self._bytes_seen = max(self._bytes_seen, min(position, self.bytes_total))
        checked = self.bytes_total if finished else self._bytes_seen
        return {"rows_checked": rows, "bytes_checked": checked, "bytes_total": self.bytes_total}

    def write(self, finished: bool = False) -> None:
        temporary = self._out.with_name(self._out.name + ".tmp")
        temporary.write_text(json.dumps(self.snapshot(finished)))
        os.replace(temporary, self._out)


def read_progress(path: Path) -> dict[str, Any] | None:
    """The newest progress written to `path`, or None before the first."""
    try:
        value = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _files_of(path: Path) -> list[Path]:
    if path.is_dir():
        return [child for child in path.rglob("*") if child.is_file()]
    return [path]


def _size_bytes(path: Path) -> int:
    return sum(child.stat().st_size for child in _files_of(path))


def _read_position(targets: set[str]) -> int | None:
    """The furthest offset of this process's descriptors open on one of `targets` (a folder's
    files are read one after the other: the sum of the finished ones is not known, the open one's
    offset is a lower bound, which is enough for a progress figure)."""
    try:
        descriptors = os.listdir(_FD_DIR)
    except OSError:
        return None
    furthest: int | None = None
    for descriptor in descriptors:
        try:
            if os.readlink(_FD_DIR / descriptor) not in targets:
                continue
            for line in Path(f"/proc/self/fdinfo/{descriptor}").read_text().splitlines():
                if line.startswith("pos:"):
                    furthest = max(furthest or 0, int(line.split()[1]))
        except (OSError, ValueError):  # closed meanwhile
            continue
    return furthest
