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

Weights & Biases (`{"type": "wandb", "wandb": {"project": ...}}`): a run with the job's id (a
resumed attempt resumes it), logged through the wandb library to the operator's W&B server with
the tenant's API key; the library's own system metrics, code, git and package list are off. Where
the operator runs W&B offline, the run's offline file is copied beside the job like TensorBoard's
(`artifact=wandb`, ready for `wandb sync`).

MLflow (`{"type": "mlflow", "mlflow": {...}}`): a run tagged with the job id in the named
experiment (a resumed attempt reopens it), through MLflow's tracking store client; metrics go in
batches. A tenant's server is reached only through the egress policy (`guard_urllib3`).

What a tracker needs from the control plane (server, key) is asked for once, when the trackers
are made (`credentials.fetch_tracking`). The trackers finish before the job's result is reported
(bounded by FLUSH_TIMEOUT_S), so a job that succeeded has complete runs.
"""

from __future__ import annotations

import logging
import math
import os
import queue
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from tuneforge.domain.metrics import objective_metrics
from tuneforge.storage import layout
from tuneforge.storage.store import ObjectStore
from tuneforge.train.reporter import message_event

log = logging.getLogger(__name__)

MAX_PENDING = 10_000
FLUSH_TIMEOUT_S = 180.0
_STOP = object()


class Tracker(Protocol):
    name: str

    def start(self, config: dict[str, Any]) -> None: ...
    def log(self, step: int, metrics: dict[str, float]) -> None: ...
    def sync(self) -> None: ...
    def finish(self, summary: dict[str, Any], succeeded: bool) -> None: ...


Access = Callable[[], dict[str, dict[str, Any]]]  # what the control plane says about the trackers


def _numbers(summary: dict[str, Any]) -> dict[str, float]:
    return {key: float(value) for key, value in summary.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)}


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

    def finish(self, summary: dict[str, Any], succeeded: bool) -> None:
        for key, value in _numbers(summary).items():
            self.writer.add_scalar(f"final/{key}", value, int(summary.get("steps", 0)))
        for key, value in summary.items():
            if isinstance(value, str):
                self.writer.add_text(f"final/{key}", value, int(summary.get("steps", 0)))
        self.writer.close()
        self.sync()
        shutil.rmtree(self.local, ignore_errors=True)


class WandbTracker:
    """A W&B run named after the job, through the wandb library (its service process included)."""

    name = "wandb"

    def __init__(self, spec: Any, store: ObjectStore, given: dict[str, Any], access: Access) -> None:
        self.spec, self.store, self.given, self.access = spec, store, given, access
        self.prefix = layout.wandb_prefix(spec.tenant_id, spec.job_id)
        self.local = Path(tempfile.mkdtemp(prefix=f"tuneforge-wandb-{spec.job_id}-"))
        self.run: Any = None
        self.offline = False

    def start(self, config: dict[str, Any]) -> None:
        import wandb

        found = self.access().get("wandb")
        if not found:
            raise PermissionError("the control plane gave no W&B settings for this job")
        self.offline = found.get("mode") == "offline"
        if not self.offline and not found.get("api_key"):
            raise PermissionError("no W&B API key: the tenant secret is missing")
        settings = wandb.Settings(
            mode="offline" if self.offline else "online", api_key=found.get("api_key") or None,
            base_url=found.get("base_url") or "https://api.wandb.ai", root_dir=str(self.local),
            # the platform's host is not the tenant's to see: no system metrics, code, git or packages
            save_code=False, disable_git=True, disable_job_creation=True, x_disable_stats=True,
            x_disable_meta=True, x_disable_machine_info=True, x_save_requirements=False, console="off", silent=True)
        spec = self.spec
        tags = ["tuneforge/finetune", f"tuneforge/{spec.base_model.name}"[:64], f"tuneforge/{spec.job_id}"[:64]]
        tags += [tag for tag in self.given.get("tags") or [] if tag not in tags]
        self.run = wandb.init(
            project=self.given["project"], entity=self.given.get("entity"), name=self.given.get("name") or spec.job_id,
            id=spec.job_id, tags=tags, config=config, resume="allow", settings=settings, reinit="create_new")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def sync(self) -> None:
        """Offline: the run's file so far, copied beside the job (online, the library streams it)."""
        if not self.offline:
            return
        for path in sorted(self.local.glob("wandb/offline-run-*/run-*.wandb")):
            self.store.put_file(f"{self.prefix}/{path.parent.name}/{path.name}", path)

    def finish(self, summary: dict[str, Any], succeeded: bool) -> None:
        if self.run is not None:
            self.run.summary.update({f"final/{key}": value for key, value in summary.items()
                                     if isinstance(value, (str, int, float)) and not isinstance(value, bool)})
            self.run.finish(exit_code=0 if succeeded else 1)
            self.run = None
            self._wait_for_the_service()
            self.sync()
        shutil.rmtree(self.local, ignore_errors=True)

    @staticmethod
    def _wait_for_the_service() -> None:
        """`run.finish()` returns before wandb's service process has written the run out (offline,
        its file can still be only a header): shutting the service down waits until it has. The
        trainer runs one job, so nothing else here uses the service."""
        import wandb

        try:
            wandb.teardown()
        except SystemExit as exc:  # the library exits when its service did not end well
            raise RuntimeError(f"the W&B service ended with exit code {exc.code}") from None


_BATCH_METRICS = 500  # MLflow's log_batch takes at most 1000 metrics
_BATCH_SECONDS = 5.0
_BATCH_PARAMS = 100


class MlflowTracker:
    """An MLflow run tagged with the job id, through MLflow's tracking store client."""

    name = "mlflow"

    def __init__(self, spec: Any, given: dict[str, Any], access: Access) -> None:
        self.spec, self.given, self.access = spec, given, access
        self.client: Any = None
        self.run_id = ""
        self.pending: list[Any] = []
        self.flushed_at = time.monotonic()

    def start(self, config: dict[str, Any]) -> None:
        from mlflow.entities import Param, RunStatus, RunTag, ViewType

        found = self.access().get("mlflow")
        if not found:
            raise PermissionError("the control plane gave no MLflow tracking server for this job")
        self.client = _mlflow_store(found, self.spec)
        name = self.given.get("experiment_name") or "tuneforge"
        experiment = self.client.get_experiment_by_name(name)
        if experiment is None:
            experiment_id = self.client.create_experiment(name)
        elif experiment.lifecycle_stage != "active":
            raise PermissionError("the MLflow experiment is deleted")
        else:
            experiment_id = experiment.experiment_id
        job_id = self.spec.job_id
        earlier = self.client.search_runs([experiment_id], f"tags.`tuneforge.job_id` = '{job_id}'",
                                          ViewType.ACTIVE_ONLY, 1)
        if earlier:  # a resumed attempt goes on with the run its job began
            self.run_id = earlier[0].info.run_id
            self.client.update_run_info(self.run_id, RunStatus.RUNNING, None, None)
            return
        tags = {**(self.given.get("tags") or {}), "tuneforge.job_id": job_id,
                "tuneforge.base_model": self.spec.base_model.name, "mlflow.source.name": "tuneforge"}
        run = self.client.create_run(experiment_id, "tuneforge", _now_ms(),
                                     [RunTag(key, str(value)) for key, value in tags.items()],
                                     self.given.get("run_name") or job_id)
        self.run_id = run.info.run_id
        params = [Param(key, str(value)[:6000]) for key, value in sorted(config.items())]
        for start in range(0, len(params), _BATCH_PARAMS):
            self.client.log_batch(self.run_id, [], params[start:start + _BATCH_PARAMS], [])

    def log(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        stamp = _now_ms()
        self.pending += [Metric(key, value, stamp, step) for key, value in metrics.items() if math.isfinite(value)]
        if len(self.pending) >= _BATCH_METRICS or time.monotonic() - self.flushed_at >= _BATCH_SECONDS:
            self.sync()

    def sync(self) -> None:
        while self.pending:
            batch, self.pending = self.pending[:_BATCH_METRICS], self.pending[_BATCH_METRICS:]
            self.client.log_batch(self.run_id, batch, [], [])
        self.flushed_at = time.monotonic()

    def finish(self, summary: dict[str, Any], succeeded: bool) -> None:
        from mlflow.entities import Metric, RunStatus, RunTag

        if self.client is None:
            return
        step = int(summary.get("steps", 0))
        self.pending += [Metric(f"final/{key}", value, _now_ms(), step) for key, value in _numbers(summary).items()]
        self.sync()
        texts = [RunTag(f"tuneforge.{key}", value) for key, value in summary.items() if isinstance(value, str)]
        if texts:
            self.client.log_batch(self.run_id, [], [], texts)
        status = RunStatus.FINISHED if succeeded else RunStatus.KILLED  # a resumed attempt reopens it
        self.client.update_run_info(self.run_id, status, _now_ms(), None)
        self.client = None


def _now_ms() -> int:
    return int(time.time() * 1000)


def _mlflow_store(found: dict[str, Any], spec: Any) -> Any:
    """MLflow's tracking store for the server the control plane named: a tenant's http(s) server
    behind the egress policy, with the tenant's credentials; or the operator's store (http(s), or
    a database or file store of MLflow's)."""
    uri = str(found["tracking_uri"])
    # a server that is down costs seconds per request, not minutes (MLflow's default backs off 2, 4 … 64 s)
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
    if urlsplit(uri).scheme.lower() in ("http", "https"):
        from mlflow.store.tracking.rest_store import RestStore
        from mlflow.utils.rest_utils import MlflowHostCreds

        if not found.get("operator"):
            from tuneforge.security.egress import EgressPolicy
            from tuneforge.security.urllib3_guard import guard_urllib3
            from tuneforge.settings import Settings

            settings = Settings()
            policy = EgressPolicy.from_settings(settings)
            policy.addresses_for(urlsplit(uri).hostname or "")  # refused now rather than after MLflow's retries
            guard_urllib3(policy, exempt=[  # and at every connect: a DNS answer may change
                urlsplit(spec.callback_url).hostname or "", urlsplit(settings.s3_endpoint_url or "").hostname or ""])
        creds = MlflowHostCreds(uri.rstrip("/"), username=found.get("username"), password=found.get("password"),
                                token=found.get("token"))
        return RestStore(lambda: creds)
    if not found.get("operator"):
        raise PermissionError("a tenant's MLflow server must be an http(s) URL")
    if urlsplit(uri).scheme.lower() in ("", "file"):
        os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"  # the operator chose MLflow's file store on purpose
    # MLflow's own factory of its database and file stores (it has no public one)
    from mlflow.tracking._tracking_service.utils import _get_store

    return _get_store(uri)


def scalars(row: dict[str, Any]) -> dict[str, float]:
    """A step's history row as tracker metrics: train/..., valid/..., system/..."""
    names = {"train_loss": "train/loss", "train_accuracy": "train/mean_token_accuracy",
             "valid_loss": "valid/loss", "valid_mean_token_accuracy": "valid/mean_token_accuracy",
             "learning_rate": "train/learning_rate", "grad_norm": "train/grad_norm",
             "tokens_per_second": "system/tokens_per_second", "peak_memory_mb": "system/peak_memory_mb",
             "mfu": "system/mfu", "padding_fraction": "system/padding_fraction"}
    shown_values = {shown: float(row[key]) for key, shown in names.items()
                    if isinstance(row.get(key), (int, float)) and not isinstance(row.get(key), bool)}
    # an objective's own figures (`Scores.metrics`), under train/ by the name it gave them
    shown_values.update({f"train/{name}": float(value) for name, value in objective_metrics(row).items()
                         if isinstance(value, (int, float)) and not isinstance(value, bool)})
    return shown_values


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
    def from_spec(cls, spec: Any, store: ObjectStore, reporter: Any, access: Access | None = None) -> Trackers:
        """`access`: what the control plane says about the trackers (default: asked once, with the
        job token, when the first tracker that needs it starts)."""
        if access is None:
            access = _asked_once(spec)
            if any(item.get("type") in ("wandb", "mlflow") for item in spec.integrations):
                try:
                    access()  # now, while the attempt is surely current: the tracking thread may lag
                except Exception:  # noqa: BLE001 - each tracker that needs it reports it, the job goes on
                    pass
        built: list[Tracker] = []
        for integration in spec.integrations:
            kind = integration.get("type")
            try:
                if kind == "tensorboard":
                    built.append(TensorBoardTracker(store, spec.tenant_id, spec.job_id, spec.attempt))
                elif kind == "wandb":
                    built.append(WandbTracker(spec, store, integration.get("wandb") or {}, access))
                elif kind == "mlflow":
                    built.append(MlflowTracker(spec, integration.get("mlflow") or {}, access))
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

    def finish(self, summary: dict[str, Any], succeeded: bool = True) -> None:
        """The last record (`succeeded`: the job's training ended well; otherwise the attempt stopped
        or failed), then wait (bounded) for the queue to drain."""
        if self._thread is None:
            return
        self._put(("finish", summary, succeeded), block=True)
        self._put(_STOP, block=True)
        self._thread.join(FLUSH_TIMEOUT_S)
        if self._thread.is_alive():  # a tracker still closing its run: the job goes on without waiting more
            self.reporter.report("events", message_event(
                f"experiment tracking did not finish within {FLUSH_TIMEOUT_S:.0f} s; its last records may arrive "
                "after the job's result", level="warn", data={"code": "tracking_slow"}))
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


def _asked_once(spec: Any) -> Access:
    from tuneforge.train import credentials

    found: list[dict[str, dict[str, Any]]] = []
    lock = threading.Lock()

    def access() -> dict[str, dict[str, Any]]:
        with lock:
            if not found:
                found.append(credentials.fetch_tracking(spec))
            return found[0]

    return access


def _warn(reporter: Any, name: str, exc: BaseException) -> None:
    log.warning("integration %s failed: %r", name, exc)
    reporter.report("events", message_event(
        f"the {name} integration stopped: {type(exc).__name__}; training goes on without it", level="warn",
        data={"integration": name, "error": type(exc).__name__}))
