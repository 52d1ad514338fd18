"""Experiment tracking from the trainer: a job's `integrations`, fed hyperparameters, per-step
metrics, eval results and the final artifact's place.

Every tracker runs behind one queue and one thread (`Trackers`): the training loop only
enqueues, a tracker that is slow or down never holds a step up, and one that fails is reported
once as a warning event and dropped; the job goes on. The queue is bounded: past
`MAX_PENDING` records the newest are dropped (and counted in the warning), never memory.

TensorBoard (`{"type": "tensorboard"}`): event files written to a local folder and copied to
the object store under the job (`layout.tensorboard_prefix`) at each checkpoint and at the end,
so a preempted attempt keeps what it logged; a resumed attempt adds its own event file beside
the earlier ones. Downloadable with `GET /v1/fine_tuning/jobs/{id}/download?artifact=tensorboard`.
"""

from __future__ import annotations

import logging
import queue
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any, Protocol

from tuneforge.storage import layout
from tuneforge.storage.store import ObjectStore
from tuneforge.train.reporter import message_event

log = logging.getLogger(__name__)

MAX_PENDING = 10_000
FLUSH_TIMEOUT_S = 60.0
_STOP = object()


class Tracker(Protocol):
    name: str

    def start(self, config: dict[str, Any]) -> None: ...
    def log(self, step: int, metrics: dict[str, float]) -> None: ...
    def sync(self) -> None: ...
    def finish(self, summary: dict[str, Any]) -> None: ...


class TensorBoardTracker:
    name = "tensorboard"

    def __init__(self, store: ObjectStore, tenant_id: str, job_id: str, attempt: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.store = store
        self.prefix = layout.tensorboard_prefix(tenant_id, job_id)
        self.local = Path(tempfile.mkdtemp(prefix=f"tuneforge-tb-{job_id}-"))
        self.writer = SummaryWriter(log_dir=str(self.local), filename_suffix=f".attempt-{attempt}")

    def start(self, config: dict[str, Any]) -> None:
        shown = "\n".join(f"| {key} | {value} |" for key, value in sorted(config.items()))
        self.writer.add_text("hyperparameters", "| setting | value |\n| --- | --- |\n" + shown, 0)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)

    def sync(self) -> None:
        self.writer.flush()
        for path in sorted(self.local.iterdir()):
            if path.is_file():
                self.store.put_file(f"{self.prefix}/{path.name}", path)

    def finish(self, summary: dict[str, Any]) -> None:
        for key, value in summary.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(f"final/{key}", value, int(summary.get("steps", 0)))
            elif isinstance(value, str):
                self.writer.add_text(f"final/{key}", value, int(summary.get("steps", 0)))
        self.writer.close()
        self.sync()
        shutil.rmtree(self.local, ignore_errors=True)


def scalars(row: dict[str, Any]) -> dict[str, float]:
    """A step's history row as tracker metrics: train/..., valid/..., system/..."""
    names = {"train_loss": "train/loss", "train_accuracy": "train/mean_token_accuracy",
             "valid_loss": "valid/loss", "valid_mean_token_accuracy": "valid/mean_token_accuracy",
             "learning_rate": "train/learning_rate", "grad_norm": "train/grad_norm",
             "tokens_per_second": "system/tokens_per_second", "peak_memory_mb": "system/peak_memory_mb",
             "mfu": "system/mfu", "padding_fraction": "system/padding_fraction"}
    return {shown: float(row[key]) for key, shown in names.items()
            if isinstance(row.get(key), (int, float)) and not isinstance(row.get(key), bool)}


class Trackers:
    """The job's trackers behind one bounded queue and one thread."""

    def __init__(self, trackers: list[Tracker], reporter: Any) -> None:
        self.trackers = list(trackers)
        self.reporter = reporter
        self.dropped = 0
        self._queue: queue.Queue = queue.Queue(maxsize=MAX_PENDING)
        self._thread: threading.Thread | None = None
        if self.trackers:
            self._thread = threading.Thread(target=self._work, name="tuneforge-tracking", daemon=True)
            self._thread.start()

    @classmethod
    def from_spec(cls, spec: Any, store: ObjectStore, reporter: Any) -> "Trackers":
        built: list[Tracker] = []
        for integration in spec.integrations:
            kind = integration.get("type")
            try:
                if kind == "tensorboard":
                    built.append(TensorBoardTracker(store, spec.tenant_id, spec.job_id, spec.attempt))
                else:
                    raise ValueError(f"unknown integration {kind!r}")
            except Exception as exc:  # noqa: BLE001 - a tracker never fails the job
                _warn(reporter, str(kind), exc)
        return cls(built, reporter)

    def start(self, config: dict[str, Any]) -> None:
        self._put(("start", config))

    def log(self, step: int, row: dict[str, Any]) -> None:
        self._put(("log", step, scalars(row)))

    def sync(self) -> None:
        self._put(("sync",))

    def finish(self, summary: dict[str, Any]) -> None:
        """The last record, then wait (bounded) for the queue to drain."""
        if self._thread is None:
            return
        self._put(("finish", summary), block=True)
        self._put(_STOP, block=True)
        self._thread.join(FLUSH_TIMEOUT_S)
        self._thread = None  # finished: later records (and a second finish) are no-ops
        if self.dropped:
            self.reporter.report("events", message_event(
                f"experiment tracking dropped {self.dropped} record(s): the trackers were too slow",
                level="warn", data={"dropped": self.dropped}))

    def _put(self, item: Any, block: bool = False) -> None:
        if self._thread is None:
            return
        try:
            self._queue.put(item, block=block, timeout=FLUSH_TIMEOUT_S if block else None)
        except queue.Full:
            self.dropped += 1

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            for tracker in list(self.trackers):
                try:
                    getattr(tracker, item[0])(*item[1:])
                except Exception as exc:  # noqa: BLE001 - a failing tracker is dropped, the job goes on
                    self.trackers.remove(tracker)
                    _warn(self.reporter, tracker.name, exc)


def _warn(reporter: Any, name: str, exc: BaseException) -> None:
    log.warning("integration %s failed: %r", name, exc)
    reporter.report("events", message_event(
        f"the {name} integration stopped: {type(exc).__name__}; training goes on without it", level="warn",
        data={"integration": name, "error": type(exc).__name__}))
