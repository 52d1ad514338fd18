"""Chaos: preemptions, crashed trainers and a crashing control plane while jobs train.

    python benchmarks/chaos.py [--jobs 8] [--minutes 3] [--seed 0] [--steps 600]

Builds a fresh TUNEFORGE_HOME through the real CLI (migrate, a tenant, the
tiny random Llama of `tuneforge.demo.tiny_model` as base model) and runs
`tuneforge serve` as a separate process with TUNEFORGE_LOCAL_GPUS=8 (eight
logical slots on this CPU host). Every job is LoRA on its own demo mapping
(`tuneforge.demo.dataset`, a different set of keys per job), with a fixed seed.

1. Reference: the N jobs run concurrently, undisturbed. Kept per job: the
   per-step train losses (metrics events) and the bytes of the final
   `adapter_model.safetensors` (from GET /v1/fine_tuning/jobs/{id}/download).
2. Chaos: the same N jobs (same files, same seeds) are created again. For
   `--minutes`, every 2-6 s, one of these is drawn (a seeded RNG, weights
   0.5 / 0.3 / 0.2; a draw that is not possible at that moment is redrawn a
   second later; at most one restart per 30 s):
     SIGTERM  a trainer in its training loop: a preemption notice (checkpoint,
              exit 12);
     SIGKILL  a trainer in its training loop: a crash;
     restart  SIGKILL the control plane, wait, start it again on the same
              port, database and home.
   Then nothing more is done until every job has ended.
3. The figures: how the jobs ended, the attempts, the actions, the steps
   trained more than once (lost work) per kind of interruption, whether every
   step's metrics arrived, whether every loss and every final adapter equals
   the reference bit for bit, and how long an attempt takes from launch to
   "resumed from the checkpoint".

Trainers are found through /proc (command lines with `tuneforge.train` and a
spec under this benchmark's home; the spec name carries job id and attempt).
A trainer is acted on only once its log shows a step and while that step is
not the last one, so every signal interrupts training (not the start-up, not
the upload of the final adapter). A SIGTERM also needs the trainer to catch
SIGTERM already (its SigCgt mask in /proc): before the trainer has installed
its handler, SIGTERM simply ends the process, a crash rather than a notice.

The platform fails a job after `max_attempt_failures` platform failures (a
crash, an expired lease, ...). The chaos never drives a job there: an action
that may end in a platform failure (any SIGKILL; a SIGTERM to a trainer that
a restarted control plane adopted, whose exit code it cannot see; a restart
while a preempted trainer's exit is not yet recorded) is only taken while the
job has at least one failure to spare beyond it.

Measured from the database (attempts, events with their attempt number) and
from the trainers' own logs (HOME/attempts/JOB-attempt-N.log: one line per
step trained, the checkpoint it resumed from), all on 127.0.0.1. Every
process started here is stopped on exit, errors and Ctrl-C; the temp home is
deleted unless --keep-home.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import math
import os
import random
import re
import signal
import statistics
import sys
import tarfile
import time
from collections import Counter, defaultdict
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import (  # noqa: E402 - benchmarks/ is not a package
    BenchHome,
    PostgresDatabase,
    ServerProcess,
    load_average,
    local_client,
    machine_lines,
)

BASE_MODEL = "tiny-chat"
LOCAL_GPUS = 8
BATCH_SIZE = 2
N_EPOCHS = 10
TERMINAL = ("succeeded", "failed", "cancelled")
POLL_S = 0.25
JOB_TIMEOUT_S = 1800.0  # per phase, after the chaos window
# The server's settings for both phases (the rest are the defaults).
SERVER_ENV = {
    "TUNEFORGE_LOCAL_GPUS": str(LOCAL_GPUS),
    "TUNEFORGE_SCHEDULER_TICK_S": "0.2",
    "TUNEFORGE_HEARTBEAT_INTERVAL_S": "1",
    # longer than a restart of the control plane takes on a loaded machine, so no
    # adopted trainer loses its lease while the control plane is away
    "TUNEFORGE_LEASE_TIMEOUT_S": "30",
    # training is what is disturbed and compared; the post-training eval would only add time
    "TUNEFORGE_EVAL_BY_DEFAULT": "false",
    # every trainer a child of the control plane with its spec on its command line, which is how
    # `running_trainers` finds them and tells adopted ones apart (forked warm, they would be the
    # warm process's children, under its command line)
    "TUNEFORGE_TRAINER_WARM_START": "false",
}
ACTION_WEIGHTS = {"sigterm": 0.5, "sigkill": 0.3, "restart": 0.2}
GAP_S = (2.0, 6.0)  # pause between two chaos actions
OUTAGE_S = (0.5, 3.0)  # how long the control plane stays dead before it is started again
RETRY_S = 1.0  # when the drawn action is not possible, draw again this much later
RESTART_GAP_S = 30.0  # at most one control-plane restart in this many seconds

SPEC_NAME = re.compile(r"(ftjob-[A-Za-z0-9]+)-attempt-(\d+)\.json")
LOG_TIME = r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) "
STEP_LINE = re.compile(LOG_TIME + r"INFO tuneforge\.train\.loop: step (\d+)/(\d+) ", re.MULTILINE)
RESUMED_LINE = re.compile(LOG_TIME + r"INFO tuneforge\.train\.loop: resumed from \S*/step-(\d+)\s*$",
                          re.MULTILINE)
EXIT_LINE = re.compile(LOG_TIME + r"INFO tuneforge\.train: exit (\d+) ", re.MULTILINE)
SIGTERM_BIT = 1 << (signal.SIGTERM - 1)


# -- the jobs ---------------------------------------------------------------------


@dataclass
class JobConfig:
    index: int
    seed: int
    n_keys: int
    file_id: str = ""

    def body(self, checkpoint_every: int) -> dict:
        from tuneforge.demo.dataset import DEMO_LORA

        return {
            "model": BASE_MODEL, "training_file": self.file_id, "seed": self.seed, "suffix": f"chaos{self.index}",
            "method": {"type": "supervised", "supervised": {"hyperparameters": {
                "n_epochs": N_EPOCHS, "batch_size": BATCH_SIZE, "learning_rate_multiplier": 1.0}}},
            "training_type": {"type": "lora", **DEMO_LORA},
            "checkpointing": {"every_steps": checkpoint_every, "keep_last": 2},
        }


@dataclass
class Outcome:
    """What one job left behind once it ended."""

    job_id: str
    status: str
    error: dict | None
    adapter: bytes | None
    results: bytes | None  # the step_metrics.csv result file: the trainer's own per-step history
    total_steps: int
    # every metrics event: (attempt, step, train_loss), in the order they were stored
    metrics: list[tuple[int, int, float]]


def steps_for(requested: int) -> tuple[int, int]:
    """(n_keys, total steps): N_EPOCHS epochs of batches of BATCH_SIZE over n_keys examples."""
    n_keys = max(10, round(requested * BATCH_SIZE / N_EPOCHS))
    n_keys += n_keys % BATCH_SIZE  # whole batches
    return n_keys, N_EPOCHS * n_keys // BATCH_SIZE


def upload_files(client: httpx.Client, jobs: list[JobConfig]) -> None:
    from tuneforge.demo.dataset import demo_examples

    for job in jobs:
        lines = "".join(json.dumps(example) + "\n" for example in demo_examples(job.n_keys, seed=job.seed))
        response = client.post("/v1/files", data={"purpose": "fine-tune"},
                               files={"file": (f"chaos-{job.index}.jsonl", lines.encode(), "application/jsonl")})
        response.raise_for_status()
        job.file_id = response.json()["id"]


def create_jobs(client: httpx.Client, jobs: list[JobConfig], checkpoint_every: int) -> list[str]:
    ids = []
    for job in jobs:
        response = client.post("/v1/fine_tuning/jobs", json=job.body(checkpoint_every))
        if response.status_code != 200:
            raise RuntimeError(f"creating job {job.index} failed: {response.status_code} {response.text[:500]}")
        ids.append(response.json()["id"])
    return ids


def statuses(client: httpx.Client, job_ids: list[str], tries: int = 5) -> dict[str, str]:
    """Every job's status; retried a few times, the control plane may just have been restarted."""
    for attempt in range(tries):
        try:
            return {job_id: client.get(f"/v1/fine_tuning/jobs/{job_id}").json()["status"] for job_id in job_ids}
        except httpx.TransportError:
            if attempt + 1 == tries:
                raise
            time.sleep(1.0)
    raise AssertionError("unreachable")


def adapter_bytes(client: httpx.Client, job_id: str) -> bytes | None:
    response = client.get(f"/v1/fine_tuning/jobs/{job_id}/download", params={"artifact": "adapter"}, timeout=120)
    if response.status_code != 200:
        return None
    with tarfile.open(fileobj=io.BytesIO(response.content), mode="r:gz") as archive:
        for member in archive.getmembers():
            if member.name.endswith("adapter_model.safetensors"):
                handle = archive.extractfile(member)
                return handle.read() if handle else None
    return None


# -- the database and the trainers' logs ---------------------------------------------


class Records:
    """Read-only look at the control plane's database."""

    def __init__(self, url: str) -> None:
        from tuneforge.db.engine import Database

        self.db = Database(url)

    def attempts(self, job_ids: list[str]) -> dict[str, list]:
        from sqlalchemy import select

        from tuneforge.db.tables import Attempt

        found: dict[str, list] = defaultdict(list)
        with self.db.session() as session:
            for row in session.scalars(select(Attempt).where(Attempt.job_id.in_(job_ids)).order_by(Attempt.number)):
                session.expunge(row)
                found[row.job_id].append(row)
        return found

    def events(self, job_ids: list[str]) -> dict[str, list]:
        from sqlalchemy import select

        from tuneforge.db.tables import JobEvent

        found: dict[str, list] = defaultdict(list)
        with self.db.session() as session:
            for row in session.scalars(select(JobEvent).where(JobEvent.job_id.in_(job_ids)).order_by(JobEvent.pk)):
                session.expunge(row)
                found[row.job_id].append(row)
        return found

    def close(self) -> None:
        self.db.dispose()


def outcomes(client: httpx.Client, records: Records, job_ids: list[str]) -> list[Outcome]:
    events = records.events(job_ids)
    found = []
    for job_id in job_ids:
        job = client.get(f"/v1/fine_tuning/jobs/{job_id}").json()
        metrics = [(e.attempt, int(e.data["step"]), float(e.data["train_loss"]))
                   for e in events[job_id] if e.event_type == "metrics" and e.data]
        totals = {int(e.data["total_steps"]) for e in events[job_id] if e.event_type == "metrics" and e.data}
        results = None
        if job.get("result_files"):
            response = client.get(f"/v1/files/{job['result_files'][0]}/content")
            results = response.content if response.status_code == 200 else None
        found.append(Outcome(job_id, job["status"], job.get("error"),
                             adapter_bytes(client, job_id) if job["status"] == "succeeded" else None,
                             results, max(totals) if totals else 0, metrics))
    return found


@dataclass
class AttemptLog:
    """What one attempt's trainer wrote to its log."""

    steps: list[int] = field(default_factory=list)
    first_step_at: float | None = None
    resumed_step: int | None = None
    resumed_at: float | None = None
    exit_code: int | None = None


def _log_time(text: str) -> float:
    stamp, millis = text.split(",")
    return time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) + int(millis) / 1000


def read_attempt_log(path: Path) -> AttemptLog:
    parsed = AttemptLog()
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return parsed
    for match in STEP_LINE.finditer(text):
        parsed.steps.append(int(match.group(2)))
        if parsed.first_step_at is None:
            parsed.first_step_at = _log_time(match.group(1))
    resumed = RESUMED_LINE.search(text)
    if resumed:
        parsed.resumed_step, parsed.resumed_at = int(resumed.group(2)), _log_time(resumed.group(1))
    exited = EXIT_LINE.search(text)
    if exited:
        parsed.exit_code = int(exited.group(2))
    return parsed


@dataclass
class Trainer:
    pid: int
    job_id: str
    attempt: int
    parent: int
    catches_sigterm: bool


def running_trainers(home: BenchHome) -> list[Trainer]:
    """Live trainer processes of this benchmark's home (a zombie has an empty command line)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().decode("utf-8", "replace")
            status = (entry / "status").read_text()
        except OSError:
            continue
        spec = SPEC_NAME.search(cmdline)
        if "tuneforge.train" not in cmdline or str(home.root) not in cmdline or not spec:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        caught = int(fields.get("SigCgt", "0").strip() or "0", 16)
        found.append(Trainer(int(entry.name), spec.group(1), int(spec.group(2)), int(fields["PPid"].strip()),
                             bool(caught & SIGTERM_BIT)))
    return found


# -- the chaos ---------------------------------------------------------------------


@dataclass
class Action:
    at_s: float
    kind: str  # sigterm | sigkill | restart
    job_id: str = ""
    attempt: int = 0
    adopted: bool = False  # the trainer was launched by an earlier control-plane process
    orphaned: bool = False  # the control plane was restarted before it had recorded the attempt's end
    outage_s: float = 0.0
    step: int = 0  # the trainer's last logged step when it was signalled
    in_flight: list[tuple[str, int]] = field(default_factory=list)  # restart: trainers alive at the kill


class Chaos:
    def __init__(self, server: ServerProcess, home: BenchHome, records: Records, job_ids: list[str],
                 rng: random.Random, max_failures: int, total_steps: int) -> None:
        self.server, self.home, self.records = server, home, records
        self.job_ids, self.rng, self.max_failures = job_ids, rng, max_failures
        self.total_steps = total_steps
        self.started = time.monotonic()
        self.actions: list[Action] = []
        self.skipped: Counter[str] = Counter()
        # (job, attempt) whose end may be recorded as a platform failure because of an action here
        self.risky: set[tuple[str, int]] = set()
        self.last_restart = -math.inf
        self.signalled: set[tuple[str, int]] = set()

    def _failures_charged(self, job_id: str, attempts: dict[str, list]) -> int:
        rows = attempts.get(job_id, [])
        recorded = sum(1 for row in rows if row.failure_class == "platform")
        ended = {row.number for row in rows if row.status not in ("starting", "running")}
        pending = sum(1 for job, number in self.risky if job == job_id and number not in ended)
        return recorded + pending

    def _can_risk(self, job_id: str, attempts: dict[str, list], extra: int = 1) -> bool:
        return self._failures_charged(job_id, attempts) + extra <= self.max_failures - 1

    def _last_step(self, job_id: str, attempt: int) -> int:
        steps = read_attempt_log(self.home.root / "home" / "attempts" / f"{job_id}-attempt-{attempt}.log").steps
        return max(steps, default=0)

    def act(self) -> bool:
        """Draw a kind of action (ACTION_WEIGHTS) and take it; False if it is not possible now."""
        kinds = list(ACTION_WEIGHTS)
        kind = self.rng.choices(kinds, weights=[ACTION_WEIGHTS[k] for k in kinds])[0]
        if kind == "restart" and time.monotonic() - self.last_restart < RESTART_GAP_S:
            self.skipped["restart: too soon after the last one"] += 1
            return False
        attempts = self.records.attempts(self.job_ids)
        # trainers in their training loop: at least one step done, the last one not yet
        trainers = [t for t in running_trainers(self.home)
                    if t.job_id in self.job_ids and (t.job_id, t.attempt) not in self.signalled
                    and 0 < self._last_step(t.job_id, t.attempt) < self.total_steps]
        current_pid = self.server.proc.pid if self.server.proc else -1
        options: dict[str, list] = {
            "sigterm": [t for t in trainers if t.catches_sigterm and
                        (t.parent == current_pid or self._can_risk(t.job_id, attempts))],
            "sigkill": [t for t in trainers if self._can_risk(t.job_id, attempts)],
            "restart": [True] if self._exiting(attempts) is not None else [],
        }
        if not options[kind]:
            self.skipped[f"{kind}: nothing to act on"] += 1
            return False
        if kind == "restart":
            self._restart(attempts)
        else:
            signum = signal.SIGTERM if kind == "sigterm" else signal.SIGKILL
            self._signal(self.rng.choice(options[kind]), signum, kind, current_pid)
        return True

    def _signal(self, trainer: Trainer, signum: int, kind: str, current_pid: int) -> None:
        adopted = trainer.parent != current_pid
        step = self._last_step(trainer.job_id, trainer.attempt)
        try:
            os.kill(trainer.pid, signum)
        except ProcessLookupError:
            self.skipped[f"{kind}: the trainer had just exited"] += 1
            return
        key = (trainer.job_id, trainer.attempt)
        self.signalled.add(key)
        if kind == "sigkill" or adopted:
            self.risky.add(key)
        self.actions.append(Action(time.monotonic() - self.started, kind, trainer.job_id, trainer.attempt,
                                   adopted, step=step))

    def _exiting(self, attempts: dict[str, list]) -> list[tuple[str, int]] | None:
        """Signalled attempts whose end this control plane has not recorded yet, or None if a restart
        now could fail a job: such a trainer's exit code dies with the process that launched it, so
        its attempt ends "lost" (a platform failure), and each one needs a failure to spare."""
        ended = {(job, row.number) for job, rows in attempts.items() for row in rows
                 if row.status not in ("starting", "running")}
        exiting = [key for key in self.signalled if key not in ended and key not in self.risky]
        per_job = Counter(job for job, _ in exiting)
        if any(not self._can_risk(job, attempts, extra) for job, extra in per_job.items()):
            return None
        return exiting

    def _restart(self, attempts: dict[str, list]) -> None:
        exiting = self._exiting(attempts) or []
        alive = [(t.job_id, t.attempt) for t in running_trainers(self.home) if t.job_id in self.job_ids]
        self.risky.update(exiting)
        for action in self.actions:
            if (action.job_id, action.attempt) in exiting:
                action.orphaned = True
        at_s = time.monotonic() - self.started
        killed_at = time.monotonic()
        self.server.proc.kill()  # the server's pid only: trainers run in sessions of their own
        self.server.proc.wait(30)
        time.sleep(self.rng.uniform(*OUTAGE_S))
        self.server.start()
        self.last_restart = time.monotonic()
        self.actions.append(Action(at_s, "restart", outage_s=time.monotonic() - killed_at, in_flight=alive))

    def run(self, client: httpx.Client, minutes: float) -> float:
        """Act until the window closes or every job ended, then wait for the rest; returns the window's length."""
        window_end = self.started + minutes * 60
        next_at = self.started + self.rng.uniform(*GAP_S)
        window_s = None
        deadline = window_end + JOB_TIMEOUT_S
        while time.monotonic() < deadline:
            now = time.monotonic()
            if all(status in TERMINAL for status in statuses(client, self.job_ids).values()):
                break
            if now < window_end and now >= next_at:
                acted = self.act()
                next_at = time.monotonic() + (self.rng.uniform(*GAP_S) if acted else RETRY_S)
            elif now >= window_end and window_s is None:
                window_s = now - self.started
            time.sleep(POLL_S)
        else:
            print(f"  gave up waiting: jobs still open {JOB_TIMEOUT_S:.0f}s after the chaos window", flush=True)
        return window_s if window_s is not None else time.monotonic() - self.started


# -- the phases ---------------------------------------------------------------------


def wait_all(client: httpx.Client, job_ids: list[str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(status in TERMINAL for status in statuses(client, job_ids).values()):
            return
        time.sleep(1.0)
    raise RuntimeError(f"jobs still open after {timeout_s:.0f}s: {statuses(client, job_ids)}")


def prepare(home: BenchHome) -> str:
    """migrate, a tenant, the tiny model as base model; returns the tenant's API key."""
    from transformers.utils import logging as hf_logging

    from tuneforge.demo.tiny_model import build_tiny_model

    hf_logging.disable_progress_bar()
    home.cli("migrate")
    api_key = home.cli("tenants", "create", "chaos").strip().splitlines()[-1].strip()
    model_dir = build_tiny_model(home.root / "models" / BASE_MODEL, seed=0)
    home.cli("base-models", "add", BASE_MODEL, str(model_dir))
    return api_key


def fmt_s(values: list[float]) -> str:
    if not values:
        return "none"
    ordered = sorted(values)
    return (f"n={len(ordered)}  median {statistics.median(ordered):.2f}s  min {ordered[0]:.2f}s  "
            f"max {ordered[-1]:.2f}s")


def ranges(steps: list[int]) -> str:
    """[3, 4, 5, 9] -> '3-5, 9'"""
    parts: list[str] = []
    for step in steps:
        if parts and step == int(parts[-1].rsplit("-", 1)[-1]) + 1:
            parts[-1] = f"{parts[-1].split('-')[0]}-{step}"
        else:
            parts.append(str(step))
    return ", ".join(parts)


def sha(data: bytes | None) -> str:
    return hashlib.sha256(data).hexdigest()[:16] if data is not None else "none"


def report(args: argparse.Namespace, home: BenchHome, records: Records, reference: list[Outcome],
           chaos_jobs: list[Outcome], chaos: Chaos, window_s: float, total_steps: int) -> None:
    job_ids = [o.job_id for o in chaos_jobs]
    attempts = records.attempts(job_ids)
    attempts_dir = home.root / "home" / "attempts"
    logs = {(job_id, row.number): read_attempt_log(attempts_dir / f"{job_id}-attempt-{row.number}.log")
            for job_id in job_ids for row in attempts[job_id]}
    actions = chaos.actions
    by_kind = Counter(a.kind for a in actions)
    cause = {(a.job_id, a.attempt): a for a in actions if a.kind != "restart"}

    print("\n== chaos run")
    print(f"chaos window: {window_s:.0f}s  (asked {args.minutes:g} min; it closes early once every job has ended)")
    print(f"actions:      {by_kind['sigterm']} SIGTERM to a trainer "
          f"({sum(1 for a in actions if a.kind == 'sigterm' and a.adopted)} of them adopted), "
          f"{by_kind['sigkill']} SIGKILL to a trainer "
          f"({sum(1 for a in actions if a.kind == 'sigkill' and a.adopted)} adopted), "
          f"{by_kind['restart']} control-plane restarts (SIGKILL + start)")
    if chaos.skipped:
        print(f"draws not taken (drawn again {RETRY_S:g}s later): {dict(sorted(chaos.skipped.items()))}")
        print("              ('nothing to act on': no trainer in its training loop, or none whose job had a "
              "failure to spare)")
    outages = [a.outage_s for a in actions if a.kind == "restart"]
    if outages:
        print(f"outages:      {fmt_s(outages)}  (SIGKILL of the server to /healthz answering again)")

    ended = Counter(o.status for o in chaos_jobs)
    print(f"jobs:         {ended['succeeded']} succeeded, {ended['failed']} failed, {ended['cancelled']} cancelled, "
          f"{len(chaos_jobs) - sum(ended.values())} still open, of {len(chaos_jobs)}")
    for o in chaos_jobs:
        if o.status != "succeeded":
            print(f"   {o.job_id}: {o.status} {json.dumps(o.error)[:300]}")
    rows = [row for job_id in job_ids for row in attempts[job_id]]
    per_status = Counter(row.status for row in rows)
    per_class = Counter(row.failure_class for row in rows if row.failure_class)
    print(f"attempts:     {len(rows)} in all ({len(rows) - len(job_ids)} beyond the first of each job); by status "
          f"{dict(sorted(per_status.items()))}; by failure class {dict(sorted(per_class.items()))}")
    preempted = sum(1 for row in rows if row.status == "preempted")
    sigterm_ended = Counter()
    for a in actions:
        if a.kind == "sigterm":
            row = next((r for r in attempts[a.job_id] if r.number == a.attempt), None)
            whose = ("adopted from an earlier control plane" if a.adopted else
                     "this control plane's child, restarted before it saw the exit" if a.orphaned else
                     "this control plane's child")
            code = logs[(a.job_id, a.attempt)].exit_code if (a.job_id, a.attempt) in logs else None
            sigterm_ended[(row.status if row else "missing", row.failure_class if row else None,
                           f"trainer logged exit {code}", whose)] += 1
    print(f"preemptions:  {preempted} attempts ended 'preempted'; how the SIGTERMed attempts ended "
          f"(attempt status, failure class, the trainer's own last words, which process launched it):")
    for key, count in sorted(sigterm_ended.items(), key=str):
        print(f"   {count} x {key}")
    sigkill_ended = Counter()
    for a in actions:
        if a.kind == "sigkill":
            row = next((r for r in attempts[a.job_id] if r.number == a.attempt), None)
            sigkill_ended[(row.status, row.failure_class) if row else ("missing", None)] += 1
    print(f"kills:        how the SIGKILLed attempts ended (status, failure class): {dict(sigkill_ended)}")
    unexplained = [(job_id, row.number, row.status, row.failure_class, row.exit_code) for job_id in job_ids
                   for row in attempts[job_id] if row.status not in ("succeeded", "running", "starting")
                   and (job_id, row.number) not in cause]
    if unexplained:
        print(f"              attempts that ended early without a signal of their own "
              f"(job, attempt, status, class, exit): {unexplained}")

    # lost work: steps an attempt trained that the next attempt trained again
    lost: dict[str, list[int]] = defaultdict(list)
    computed = recomputed = 0
    for job_id in job_ids:
        numbers = [row.number for row in attempts[job_id]]
        trained = [step for n in numbers for step in logs[(job_id, n)].steps]
        computed += len(trained)
        recomputed += len(trained) - len(set(trained))
        for i, number in enumerate(numbers[:-1]):
            log = logs[(job_id, number)]
            last = max(log.steps, default=log.resumed_step or 0)
            later = [logs[(job_id, n)] for n in numbers[i + 1:]]
            resumed = next((entry.resumed_step or 0 for entry in later
                            if entry.steps or entry.resumed_step is not None),
                           None)
            if resumed is None:
                continue
            action = cause.get((job_id, number))
            status = next(r.status for r in attempts[job_id] if r.number == number)
            kind = action.kind if action else f"other ({status})"
            lost[kind].append(max(0, last - resumed))
    needed = total_steps * len(job_ids)
    print(f"steps:        {computed} optimizer steps trained for {needed} needed: {recomputed} trained more than "
          f"once ({100 * recomputed / max(1, needed):.1f}% lost work)")
    for kind in sorted(lost):
        values = lost[kind]
        print(f"   lost at a {kind}: {sum(values)} steps over {len(values)} interruptions "
              f"(max {max(values)}, checkpoint every {args.checkpoint_every}): {sorted(values)}")
    alive_at_restart = {key for a in actions if a.kind == "restart" for key in a.in_flight}
    across = Counter()
    for job_id, number in alive_at_restart:
        row = next((r for r in attempts[job_id] if r.number == number), None)
        signalled = (job_id, number) in cause
        across[f"{row.status if row else '?'}{' after a signal of the chaos' if signalled else ''}"] += 1
    print(f"restarts:     {len(alive_at_restart)} attempts had their trainer running while a control plane "
          f"was killed; they ended: {dict(across)}")

    # metrics: every step reported, and equal to the reference
    ref_by_index = {i: r for i, r in enumerate(reference)}
    missing, mismatched, compared, final_equal = {}, 0, 0, 0
    for i, o in enumerate(chaos_jobs):
        ref = {step: loss for _, step, loss in ref_by_index[i].metrics}
        reported = {step for _, step, _ in o.metrics}
        gap = sorted(set(range(1, total_steps + 1)) - reported)
        if gap:
            missing[o.job_id] = gap
        last: dict[int, float] = {}
        for _, step, loss in o.metrics:
            compared += 1
            mismatched += ref.get(step) != loss
            last[step] = loss
        final_equal += last == ref
    print(f"metrics:      {len(chaos_jobs) - len(missing)}/{len(chaos_jobs)} jobs have a metrics event for every "
          f"step 1..{total_steps}")
    for job_id, gap in missing.items():
        print(f"   {job_id}: no metrics event for {len(gap)} step(s) {ranges(gap)}")
        for number in sorted({row.number for row in attempts[job_id]}):
            trained = set(logs[(job_id, number)].steps) & set(gap)
            if not trained:
                continue
            row = next(r for r in attempts[job_id] if r.number == number)
            action = cause.get((job_id, number))
            how = (f"{action.kind} at {action.at_s:.1f}s{' (adopted)' if action.adopted else ''}" if action
                   else "no signal")
            restarts = [f"{a.at_s:.1f}s" for a in actions if a.kind == "restart" and (job_id, number) in a.in_flight]
            print(f"      attempt {number} trained {ranges(sorted(trained))}, ended {row.status} ({how}); "
                  f"control plane killed at {', '.join(restarts) or 'never'} during this attempt")
    print(f"losses:       {compared - mismatched}/{compared} reported train losses (every attempt's) equal the "
          f"reference bit for bit; {final_equal}/{len(chaos_jobs)} jobs reported a loss for every step, all equal "
          f"to the reference")
    same_results = sum(o.results is not None and o.results == ref_by_index[i].results for i, o in enumerate(chaos_jobs))
    print(f"              {same_results}/{len(chaos_jobs)} result files (step_metrics.csv, the trainer's per-step "
          f"history) equal the reference byte for byte")
    same = [o.adapter is not None and o.adapter == ref_by_index[i].adapter for i, o in enumerate(chaos_jobs)]
    print(f"adapters:     {sum(same)}/{len(chaos_jobs)} final adapter_model.safetensors equal the reference "
          f"bit for bit")
    for i, o in enumerate(chaos_jobs):
        if not same[i]:
            print(f"   job {i} {o.job_id}: sha256 {sha(o.adapter)} vs reference {sha(ref_by_index[i].adapter)}")

    # how long from launch to a resumed state
    early, late, scratch = [], [], []
    for job_id in job_ids:
        for row in attempts[job_id]:
            log = logs[(job_id, row.number)]
            if log.resumed_at is not None:
                (early if log.resumed_step <= total_steps // 2 else late).append(log.resumed_at - row.started_at)
            elif log.first_step_at is not None and row.number > 1:
                scratch.append(log.first_step_at - row.started_at)
    print(f"resume:       launch -> 'resumed from the checkpoint', checkpoint at step <= {total_steps // 2}: "
          f"{fmt_s(early)}")
    print(f"              launch -> 'resumed from the checkpoint', checkpoint at step >  {total_steps // 2}: "
          f"{fmt_s(late)}")
    if scratch:
        print(f"              launch -> first step of later attempts that found no checkpoint: {fmt_s(scratch)}")


def run(args: argparse.Namespace, stack: ExitStack) -> None:
    database = "SQLite (file in the temp home, WAL)"
    database_url = None
    if args.database_url:
        pg = PostgresDatabase(args.database_url)
        stack.callback(pg.close)
        database_url = pg.url
        database = f"PostgreSQL {pg.server_version} (fresh database {pg.name})"
    print("\n".join(machine_lines(database)), flush=True)
    home = BenchHome(database_url, keep=args.keep_home)
    stack.callback(home.close)
    print(f"home:      {home.root}{' (kept)' if args.keep_home else ''}")
    started = time.monotonic()
    api_key = prepare(home)
    n_keys, total_steps = steps_for(args.steps)
    jobs = [JobConfig(i, args.seed * 1000 + i, n_keys) for i in range(args.jobs)]

    from tuneforge.demo.dataset import DEMO_LORA
    from tuneforge.settings import Settings

    # the server runs with the default (BenchHome passes no TUNEFORGE_* variable of ours through)
    max_failures = int(Settings.model_fields["max_attempt_failures"].default)
    server = stack.enter_context(ServerProcess(home, scheduler=True, extra_env=SERVER_ENV))
    print(f"server:    {server.command_line}  ({server.url})")
    print(f"jobs:      {args.jobs} x LoRA rank {DEMO_LORA['rank']} on {n_keys} examples, batch {BATCH_SIZE}, "
          f"{N_EPOCHS} epochs = {total_steps} steps, checkpoint every "
          f"{args.checkpoint_every} steps (keep 2), seeds {jobs[0].seed}..{jobs[-1].seed}; "
          f"a job fails after {max_failures} platform failures", flush=True)
    db_url = database_url or f"sqlite:///{(home.root / 'home' / 'tuneforge.db').resolve()}"
    records = Records(db_url)
    stack.callback(records.close)

    with local_client(server.url, headers={"Authorization": f"Bearer {api_key}"}, timeout=60.0) as client:
        upload_files(client, jobs)
        print(f"setup:     {time.monotonic() - started:.0f}s", flush=True)

        print("\n== reference run (undisturbed, all jobs at once)", flush=True)
        phase = time.monotonic()
        reference_ids = create_jobs(client, jobs, args.checkpoint_every)
        wait_all(client, reference_ids, JOB_TIMEOUT_S)
        reference = outcomes(client, records, reference_ids)
        ref_attempts = records.attempts(reference_ids)
        print(f"wall time:    {time.monotonic() - phase:.0f}s")
        print(f"jobs:         {dict(Counter(o.status for o in reference))}; attempts "
              f"{sum(len(rows) for rows in ref_attempts.values())}")
        for i, o in enumerate(reference):
            steps = sorted(step for _, step, _ in o.metrics)
            print(f"   job {i} {o.job_id}: {o.status}, {o.total_steps} steps, metrics for each step once: "
                  f"{steps == list(range(1, total_steps + 1))}, final loss "
                  f"{o.metrics[-1][2] if o.metrics else math.nan:.4f}, adapter sha256 {sha(o.adapter)}")
        if any(o.status != "succeeded" for o in reference):
            raise RuntimeError("a reference job did not succeed: no reference to compare with")

        print(f"\n== chaos run (seed {args.seed}, {args.minutes:g} min of actions every "
              f"{GAP_S[0]:g}-{GAP_S[1]:g}s, weights {ACTION_WEIGHTS})", flush=True)
        phase = time.monotonic()
        chaos_ids = create_jobs(client, jobs, args.checkpoint_every)
        chaos = Chaos(server, home, records, chaos_ids, random.Random(args.seed), max_failures, total_steps)
        window_s = chaos.run(client, args.minutes)
        chaos_wall = time.monotonic() - phase
        chaos_jobs = outcomes(client, records, chaos_ids)
        report(args, home, records, reference, chaos_jobs, chaos, window_s, total_steps)
        print(f"wall time:    {chaos_wall:.0f}s (chaos phase); {time.monotonic() - started:.0f}s in all")
        print(f"load avg:     {load_average()}")
        if args.actions:
            print("\n== actions (seconds after the chaos jobs were created)")
            for a in chaos.actions:
                what = (f"restart, outage {a.outage_s:.1f}s, {len(a.in_flight)} trainers alive" if a.kind == "restart"
                        else f"{a.kind} {a.job_id} attempt {a.attempt} at step {a.step}"
                             f"{' (adopted)' if a.adopted else ''}")
                print(f"  {a.at_s:7.1f}  {what}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=8, help="jobs per phase (default 8)")
    parser.add_argument("--minutes", type=float, default=3.0, help="length of the chaos window (default 3)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the chaos RNG and of the jobs (default 0)")
    parser.add_argument("--steps", type=int, default=600,
                        help=f"optimizer steps per job (default 600; rounded to a multiple of {N_EPOCHS})")
    parser.add_argument("--checkpoint-every", type=int, default=20, help="checkpoint period in steps (default 20)")
    parser.add_argument("--database-url", help="PostgreSQL admin URL: run on a fresh database created there")
    parser.add_argument("--actions", action="store_true", help="print every chaos action")
    parser.add_argument("--keep-home", action="store_true", help="keep the temp home (logs, database)")
    args = parser.parse_args(argv)
    if not 1 <= args.jobs <= LOCAL_GPUS:
        parser.error(f"--jobs must be 1..{LOCAL_GPUS} (one slot each)")
    return args


def _stop_on_sigterm() -> None:
    def handler(_signum, _frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    _stop_on_sigterm()
    try:
        with ExitStack() as stack:
            run(args, stack)
    except KeyboardInterrupt:
        print("\ninterrupted: everything started here was stopped", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
