"""A training file larger than memory, end to end: upload, checks, training, and everyone's memory.

    python benchmarks/large_dataset.py [--gib 4] [--steps 300] [--row-kib 4] [--keep]

Writes a chat JSONL of `--gib` GiB (distinct rows of about `--row-kib` KiB: a
question and a long answer of random words, each row numbered so none is a
duplicate), then against a real control plane (`tuneforge serve` with its
scheduler and the local executor, SQLite, a local object store, the demo's
tiny model (4,096 positions) registered as the base):

1. uploads it with the official SDK's `client.uploads.upload_file_chunked`
   (64 MiB parts) and waits until the file is checked (`processed`);
2. creates a supervised job on it (1 epoch, batch 8, max_seq_length 4096: every row fits)
   and lets it train `--steps` optimizer steps, then cancels it (a whole
   epoch of a file this size is hours of CPU);
3. samples every 50 ms the resident memory (RSS, from /proc) of the control
   plane — the server and every process under it that is not a trainer (its
   API and check workers) — and of the trainer, and prints each one's peak
   beside the file's size, with the time each phase took.

The goal (issue 41): both peaks under 1.5 GB for a file of 4 GB or more.
Printed as a PASS/FAIL line, never asserted. Traffic goes to 127.0.0.1 only;
the server is stopped and the temporary folder removed on exit (`--keep`
keeps it).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import time
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import BenchHome, ServerProcess, machine_lines, process_tree  # noqa: E402

GOAL_MB = 1500.0
BASE_MODEL = "tiny"
WORDS = ("the model reads writes returns checks stores sends loads builds updates prints parses trains finds keeps "
         "file list numbers answer line config record result strings code table key value report error data "
         "server request worker cache queue batch token vector layer weight gradient loss step epoch").split()


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def command_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        return ""


def role_of(pid: int, server_pid: int) -> str:
    """What a process under the server is, from its command line."""
    command = command_of(pid)
    if pid == server_pid:
        return "server (API + scheduler)"
    if "tuneforge.train" in command:
        return "trainer"
    if "multiprocessing" in command or "isolation" in command:
        return "check worker"
    return "other: " + command[:60]


class Sampler:
    """Peak RSS of the control plane (every process under the server that is not a trainer,
    summed) and of the trainers (the largest one; a warm trainer process waiting for work
    counts as a trainer), and each role's largest process, sampled until stopped."""

    def __init__(self, server_pid: int, every_s: float = 0.05) -> None:
        self.server_pid, self.every_s = server_pid, every_s
        self.plane_peak_mb = self.trainer_peak_mb = 0.0
        self.plane_processes_peak = 0
        self.roles: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        plane_mb, plane_count = 0.0, 0
        for pid in process_tree(self.server_pid):
            role, mb = role_of(pid, self.server_pid), rss_mb(pid)
            self.roles[role] = max(self.roles.get(role, 0.0), mb)
            if role == "trainer":
                self.trainer_peak_mb = max(self.trainer_peak_mb, mb)
            else:
                plane_mb, plane_count = plane_mb + mb, plane_count + 1
        self.plane_peak_mb = max(self.plane_peak_mb, plane_mb)
        self.plane_processes_peak = max(self.plane_processes_peak, plane_count)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.sample()

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()


def write_source(path: Path, size: int, row_bytes: int, seed: int = 0) -> int:
    """Chat rows of about `row_bytes` until the file holds `size` bytes; returns the row count."""
    rng = random.Random(seed)
    rows = written = 0
    with open(path, "w", buffering=1 << 20) as out:
        while written < size:
            answer_words = max(8, int(row_bytes) // 6)
            record = {"messages": [
                {"role": "user", "content": f"Row {rows}: " + " ".join(rng.choices(WORDS, k=12)) + "?"},
                {"role": "assistant", "content": " ".join(rng.choices(WORDS, k=answer_words)) + f" ({rows})"},
            ]}
            line = json.dumps(record) + "\n"
            out.write(line)
            written += len(line)
            rows += 1
    return rows


def wait_processed(client: openai.OpenAI, file_id: str, timeout_s: float) -> openai.types.FileObject:
    deadline = time.monotonic() + timeout_s
    while True:
        file = client.files.retrieve(file_id)
        if file.status in ("processed", "error"):
            return file
        if time.monotonic() > deadline:
            raise RuntimeError(f"{file_id} still {file.status} after {timeout_s:.0f}s")
        time.sleep(1.0)


def train(client: openai.OpenAI, file_id: str, steps: int, timeout_s: float) -> dict:
    """A job on the file, trained `steps` steps then cancelled; the phases' times."""
    started = time.monotonic()
    job = client.fine_tuning.jobs.create(
        model=BASE_MODEL, training_file=file_id, seed=0,
        method={"type": "supervised", "supervised": {"hyperparameters": {
            "n_epochs": 1, "batch_size": 8, "learning_rate_multiplier": 1.0, "max_seq_length": 4096}}})
    times: dict = {"job": job.id}
    deadline = started + timeout_s
    while time.monotonic() < deadline:
        job = client.fine_tuning.jobs.retrieve(job.id)
        if "queued_s" not in times and job.status not in ("validating_files",):
            times["queued_s"] = time.monotonic() - started  # the job's data checked and prepared
        if job.status in ("failed", "cancelled", "succeeded"):
            raise RuntimeError(f"{job.id} ended {job.status}: {job.error}")
        step = last_step(client, job.id)
        if step and "first_step_s" not in times:
            times["first_step_s"] = time.monotonic() - started
            times["first_step"] = step
        if step >= steps:
            times["steps"] = step
            times["steps_s"] = time.monotonic() - started - times["first_step_s"]
            client.fine_tuning.jobs.cancel(job.id)
            return times
        time.sleep(1.0)
    raise RuntimeError(f"{job.id} had not trained {steps} steps after {timeout_s:.0f}s")


def last_step(client: openai.OpenAI, job_id: str) -> int:
    checkpoints = client.get(f"/fine_tuning/jobs/{job_id}/events", cast_to=object, options={"params": {"limit": 50}})
    steps = [int(event["data"]["step"]) for event in checkpoints.get("data", [])
             if event.get("type") == "metrics" and (event.get("data") or {}).get("step") is not None]
    return max(steps, default=0)


def run(args: argparse.Namespace) -> int:
    size = int(args.gib * 1024 ** 3)
    home = BenchHome(keep=args.keep)
    try:
        from tuneforge.demo.tiny_model import build_tiny_model

        home.cli("migrate")
        key = home.cli("tenants", "create", "bulk", "--tier", "premium").strip().splitlines()[-1].strip()
        model_dir = build_tiny_model(home.root / "models" / BASE_MODEL, seed=0, max_position_embeddings=4096)
        home.cli("base-models", "add", BASE_MODEL, str(model_dir))
        source = home.root / "train.jsonl"
        started = time.monotonic()
        rows = write_source(source, size, args.row_kib * 1024)
        print(f"source: {source.stat().st_size / 1e9:.2f} GB, {rows:,} rows, written in "
              f"{time.monotonic() - started:.0f}s")
        for line in machine_lines("sqlite"):
            print(line)
        with ServerProcess(home, scheduler=True) as server:
            client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0, timeout=24 * 3600)
            client.files.list()
            time.sleep(1.0)
            idle = Sampler(server.proc.pid)
            idle.sample()
            print(f"server: {server.command_line}\ncontrol plane RSS idle: {idle.plane_peak_mb:.0f} MB "
                  f"({idle.plane_processes_peak} processes; a waiting warm trainer {idle.trainer_peak_mb:.0f} MB)")
            with Sampler(server.proc.pid) as sampler:
                started = time.monotonic()
                upload = client.uploads.upload_file_chunked(
                    file=source, mime_type="application/jsonl", purpose="fine-tune", part_size=64 * 1024 * 1024)
                uploaded_s = time.monotonic() - started
                assert upload.file is not None, upload
                file = wait_processed(client, upload.file.id, timeout_s=6 * 3600)
                checked_s = time.monotonic() - started - uploaded_s
                print(f"upload: {uploaded_s:.0f}s ({size / 1e6 / uploaded_s:.0f} MB/s); then {file.status} after "
                      f"{checked_s:.0f}s more ({rows / max(checked_s, 1e-9):,.0f} rows/s)")
                if file.status != "processed":
                    print(f"FAIL: the file was not accepted: {file.status_details}")
                    return 1
                plane_after_upload = sampler.plane_peak_mb
                times = train(client, file.id, args.steps, timeout_s=6 * 3600)
            print(f"job {times['job']}: checked and prepared in {times.get('queued_s', 0):.0f}s; first step "
                  f"{times['first_step_s']:.0f}s after creation; {times['steps']} steps in {times['steps_s']:.0f}s "
                  f"more ({times['steps'] / max(times['steps_s'], 1e-9):.1f} steps/s)")
        print(f"\n{'process':<44} {'peak RSS':>9}")
        print(f"{'control plane, upload + file check':<44} {plane_after_upload:8.0f}M")
        print(f"{'control plane, whole run (job check too)':<44} {sampler.plane_peak_mb:8.0f}M "
              f"(up to {sampler.plane_processes_peak} processes, summed)")
        print(f"{'trainer':<44} {sampler.trainer_peak_mb:8.0f}M")
        for role, peak in sorted(sampler.roles.items()):
            print(f"{'  largest ' + role:<44} {peak:8.0f}M")
        print(f"{'the training file':<44} {source.stat().st_size / 1e6:8.0f}M")
        ok = sampler.plane_peak_mb < GOAL_MB and 0 < sampler.trainer_peak_mb < GOAL_MB
        print(f"\n{'PASS' if ok else 'FAIL'}: control plane {sampler.plane_peak_mb:.0f} MB and trainer "
              f"{sampler.trainer_peak_mb:.0f} MB at their peaks for a {source.stat().st_size / 1e9:.2f} GB file "
              f"(goal: each under {GOAL_MB:.0f} MB)")
        return 0
    finally:
        home.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=4.0, help="size of the training file (default 4)")
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps to train (default 300)")
    parser.add_argument("--row-kib", type=float, default=4.0, help="about this many KiB a row (default 4)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return run(parser.parse_args())


if __name__ == "__main__":
    raise SystemExit(main())
