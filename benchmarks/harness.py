"""What the benchmarks share: a throwaway tuneforge home driven through the real
CLI, the control plane as a separate process, a fresh PostgreSQL database, and
a description of the machine the figures were measured on.

Everything here talks to 127.0.0.1 only and is bounded in time; every process
it starts is stopped by `close()` / the context managers, on errors and Ctrl-C
too.
"""

from __future__ import annotations

import json
import os
import platform
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

import httpx

# `python -m tuneforge.cli.main` is the `tuneforge` console script, pinned to
# this interpreter so the server runs on the same Python as the benchmark.
CLI = [sys.executable, "-m", "tuneforge.cli.main"]
LOOPBACK = "127.0.0.1"
HEALTH_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0
CLI_TIMEOUT_S = 300.0
_CLK_TCK = os.sysconf("SC_CLK_TCK")


def torch_machine_line() -> str:
    """The machine and the libraries a training benchmark's figures were measured with."""
    import torch
    import transformers

    return (f"machine: {os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
            f"python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


class ReportSink:
    """A control plane's report routes as a trainer started by hand needs them, on 127.0.0.1: every
    report is answered `continue`, and the events reported are kept (`events`, in order)."""

    def __init__(self) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        sink = self
        self.events: list[dict] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.path.endswith("/events"):
                    try:
                        sink.events.extend(json.loads(body).get("events", []))
                    except (ValueError, AttributeError):
                        pass
                payload = b'{"action": "continue"}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> ReportSink:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def local_client(base_url: str, **kwargs) -> httpx.Client:
    # trust_env=False: no proxy variable may send loopback traffic elsewhere
    kwargs.setdefault("timeout", 30.0)
    return httpx.Client(base_url=base_url, trust_env=False, **kwargs)


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK  # utime, stime


def _stat_fields(pid: int) -> list[str]:
    """/proc/PID/stat after the command name: state, ppid, pgrp, session, ..."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def process_tree(root: int) -> list[int]:
    """ROOT and every live descendant of it (parent links read from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int(_stat_fields(int(entry.name))[1])
        except (OSError, IndexError, ValueError):
            continue  # the process ended while we looked
        children.setdefault(ppid, []).append(int(entry.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, ()))
    return tree


def tree_cpu_s(root: int) -> float:
    """CPU seconds of a process tree: user + system of every live process in it,
    plus what each has collected from children it already reaped (cutime, cstime),
    so that a worker that exits between two readings is still counted once."""
    total = 0.0
    for pid in process_tree(root):
        try:
            fields = _stat_fields(pid)
        except OSError:
            continue
        total += sum(int(v) for v in fields[11:15]) / _CLK_TCK  # utime, stime, cutime, cstime
    return total


def read_machine_cpu_s() -> tuple[float, float]:
    """(busy, stolen) CPU seconds of all cores since boot, from /proc/stat. Stolen
    time is when the hypervisor ran something else on our virtual cores."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[:8])
    return (user + nice + system + irq + softirq) / _CLK_TCK, steal / _CLK_TCK


def isolated_child_env(side_dir: Path, threads: int, *, cpu_only: bool,
                       extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a measured side's child runs with: ours without tuneforge's, Hugging Face's
    or the thread pools' settings, each side its own (empty, offline) Hugging Face caches, `threads`
    threads; `cpu_only`: no GPU visible."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TUNEFORGE_", "HF_", "OMP_", "MKL_"))}
    env.update({
        "HF_HOME": str(side_dir / "hf-home"),
        "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
        "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
        "PYTHONUNBUFFERED": "1", **(extra or {}),
    })
    if cpu_only:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def run_measured(argv: list[str], env: dict[str, str], log_path: Path, what: str) -> tuple[float, object]:
    """Run `argv` to its end, its output into `log_path`: (wall seconds, its `resource` usage as
    `os.wait4` gives it: CPU times, peak RSS). A non-zero exit raises with the log's tail."""
    wall = time.perf_counter()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    wall = time.perf_counter() - wall
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        tail = log_path.read_bytes()[-4000:].decode("utf-8", "replace")
        raise RuntimeError(f"{what} exited {code}:\n{tail}")
    return wall, usage


class BenchHome:
    """A fresh TUNEFORGE_HOME in a temp folder, with its environment."""

    def __init__(self, database_url: str | None = None, *, keep: bool = False) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="tuneforge-bench-"))
        self.keep = keep
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("TUNEFORGE_")}
        self.env["TUNEFORGE_HOME"] = str(self.root / "home")
        # `tuneforge migrate` does not create a missing home folder (yet): give it one
        (self.root / "home").mkdir()
        if database_url:
            self.env["TUNEFORGE_DATABASE_URL"] = database_url
        self.env.setdefault("TOKENIZERS_PARALLELISM", "false")

    def cli(self, *args: str, timeout_s: float = CLI_TIMEOUT_S) -> str:
        """Run `tuneforge ARGS`; returns stdout, raises with stderr on failure."""
        done = subprocess.run([*CLI, *args], env=self.env, capture_output=True, text=True,
                              timeout=timeout_s, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise RuntimeError(f"tuneforge {' '.join(args)} exited {done.returncode}:\n{done.stderr[-2000:]}")
        return done.stdout

    def close(self) -> None:
        kill_trainers(self.root)
        if not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)


def fake_model_dir(path: Path, max_positions: int = 512) -> Path:
    """Files shaped like a model folder: enough to register, not to load."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "max_position_embeddings": max_positions}))
    (path / "model.safetensors").write_bytes(b"\0" * 4096)
    (path / "tokenizer.json").write_text("{}")
    return path


def chat_jsonl(lines: int) -> bytes:
    rows = [json.dumps({"messages": [
        {"role": "user", "content": f"What is the code of item {i}?"},
        {"role": "assistant", "content": f"The code of item {i} is C-{i:04d}."},
    ]}) for i in range(lines)]
    return ("\n".join(rows) + "\n").encode()


def upload_training_file(client: httpx.Client, lines: int = 40) -> str:
    response = client.post("/v1/files", data={"purpose": "fine-tune"},
                           files={"file": ("bench.jsonl", chat_jsonl(lines), "application/jsonl")})
    response.raise_for_status()
    body = wait_processed(client, response.json())
    if body["status"] != "processed":
        raise RuntimeError(f"the training file was not accepted: {body}")
    return body["id"]


def wait_processed(client: httpx.Client, file: dict, timeout_s: float = 600.0) -> dict:
    """The File object once its background validation has ended (status no longer `processing`)."""
    deadline = time.monotonic() + timeout_s
    while file["status"] == "processing" and time.monotonic() < deadline:
        time.sleep(0.2)
        answer = client.get(f"/v1/files/{file['id']}")
        answer.raise_for_status()
        file = answer.json()
    return file


def _masked(database_url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(database_url).render_as_string(hide_password=True)


class ServerProcess:
    """`tuneforge serve` as a child process of the benchmark."""

    def __init__(self, home: BenchHome, *, scheduler: bool, extra_env: dict[str, str] | None = None) -> None:
        self.home = home
        self.port = free_port()
        self.url = f"http://{LOOPBACK}:{self.port}"
        self.args = ["serve", "--host", LOOPBACK, "--port", str(self.port)]
        if not scheduler:
            self.args.append("--no-scheduler")
        self.env = {**home.env, **(extra_env or {})}
        self.log_path = home.root / f"server-{self.port}.log"
        self.proc: subprocess.Popen | None = None

    @property
    def command_line(self) -> str:
        shown = [f"{k}={_masked(v) if k == 'TUNEFORGE_DATABASE_URL' else v}" for k, v in self.env.items()
                 if k.startswith("TUNEFORGE_") and k != "TUNEFORGE_HOME"]
        return " ".join(["TUNEFORGE_HOME=$TMP/home", *shown, "tuneforge", *self.args])

    def start(self) -> ServerProcess:
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> ServerProcess:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([*CLI, *self.args], env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + HEALTH_TIMEOUT_S
        with local_client(self.url, timeout=2.0) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"the server exited with {self.proc.returncode}:\n{self.log_tail()}")
                try:
                    if client.get("/healthz").status_code == 200:
                        return self
                except httpx.TransportError:
                    pass
                time.sleep(0.1)
        raise RuntimeError(f"the server did not answer /healthz within {HEALTH_TIMEOUT_S:.0f}s:\n{self.log_tail()}")

    def cpu_s(self) -> float:
        """CPU seconds of the process started (not of its children)."""
        assert self.proc is not None
        return process_cpu_s(self.proc.pid)

    def tree_cpu_s(self) -> float:
        """CPU seconds of the server and every process under it (API workers)."""
        assert self.proc is not None
        return tree_cpu_s(self.proc.pid)

    def process_count(self) -> int:
        assert self.proc is not None
        return len(process_tree(self.proc.pid))

    def log_tail(self, max_bytes: int = 3000) -> str:
        try:
            return self.log_path.read_bytes()[-max_bytes:].decode("utf-8", "replace")
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGINT (uvicorn's graceful stop), then SIGKILL of its group if it lingers."""
        if self.proc is None or self.proc.poll() is not None:
            return
        started_here = process_tree(self.proc.pid)[1:]  # API workers, if the server runs several
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(STOP_TIMEOUT_S)
        # none of its workers may outlive it: those still in its process group are killed by pid
        for pid in started_here:
            try:
                if int(_stat_fields(pid)[2]) == self.proc.pid:
                    os.kill(pid, signal.SIGKILL)
            except (OSError, IndexError, ValueError):
                pass

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *_exc) -> None:
        self.stop()


def trainer_pids(home_root: Path, job_id: str = "") -> list[int]:
    """Trainer processes whose spec lies under this benchmark's home."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().decode("utf-8", "replace")
        except OSError:
            continue
        if "tuneforge.train" in cmdline and str(home_root) in cmdline and job_id in cmdline:
            pids.append(int(entry.name))
        elif "tuneforge.train.warm" in cmdline and _forked_for(entry, home_root, job_id):
            pids.append(int(entry.name))
    return pids


def _forked_for(proc: Path, home_root: Path, job_id: str) -> bool:
    """A trainer forked warm keeps the warm process's command line: its log (stdout) names its job."""
    try:
        log = os.readlink(proc / "fd" / "1")
    except OSError:
        return False
    return log.startswith(str(home_root)) and job_id in log


def kill_trainers(home_root: Path) -> None:
    """The local executor starts each trainer in its own session: stop those
    of this benchmark's home (and only those) by pid."""
    for pid in trainer_pids(home_root):
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


class PySpy:
    """py-spy sampling a process while in the `with` block; writes folded stacks
    (one line per distinct stack with its sample count) to OUT_PATH.

    gil=True samples only the thread holding the GIL: where a CPU-bound Python
    server's one usable core goes. settle_s is a pause after starting py-spy so
    that it is attached before the work to sample begins."""

    def __init__(self, pid: int, out_path: Path, max_duration_s: float, *, rate_hz: int = 200,
                 gil: bool = True, settle_s: float = 0.5, subprocesses: bool = False) -> None:
        self.out_path = out_path
        self.settle_s = settle_s
        self.command = ["py-spy", "record", "--pid", str(pid), "--rate", str(rate_hz), "--format", "raw",
                        "--nonblocking", "--duration", str(max(1, int(max_duration_s))), "--output", str(out_path)]
        self.command += ["--gil"] if gil else []
        self.command += ["--subprocesses"] if subprocesses else []
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> PySpy:
        self.out_path.parent.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(self.command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     stdin=subprocess.DEVNULL)
        time.sleep(self.settle_s)
        return self

    def __exit__(self, *_exc) -> None:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        try:
            self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(STOP_TIMEOUT_S)


class PostgresDatabase:
    """A fresh database on the server of ADMIN_URL, dropped on close."""

    def __init__(self, admin_url: str) -> None:
        from sqlalchemy import create_engine, text
        from sqlalchemy.engine import make_url

        self._text = text
        self.name = f"tfbench_{secrets.token_hex(4)}"
        self._admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
        with self._admin.connect() as conn:
            self.server_version = conn.execute(text("SHOW server_version")).scalar()
            conn.execute(text(f'CREATE DATABASE "{self.name}"'))
        self.url = make_url(admin_url).set(database=self.name).render_as_string(hide_password=False)

    def close(self) -> None:
        with self._admin.connect() as conn:
            conn.execute(self._text(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)'))
        self._admin.dispose()


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 2**20:.1f} GiB"
    except OSError:
        pass
    return "unknown"


def _versions(names: tuple[str, ...]) -> str:
    found = []
    for name in names:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            found.append(f"{name} (not installed)")
    return ", ".join(found)


def _git_revision() -> str:
    repo = Path(__file__).resolve().parents[1]
    try:
        rev = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return f"{rev}{' + uncommitted changes' if dirty else ''}" if rev else "unknown"


def load_average() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg()) + " (1, 5, 15 min)"


def machine_lines(database: str) -> list[str]:
    import sqlite3

    sqlite_note = f" (sqlite library {sqlite3.sqlite_version})" if database.startswith("SQLite") else ""
    return [
        f"date:      {time.strftime('%Y-%m-%d %H:%M:%S %Z')}",
        f"machine:   {os.cpu_count()} cores, {_cpu_model()}, {_memory_gib()} RAM, "
        f"{platform.system()} {platform.release()}",
        f"load avg:  {load_average()} (other work on this machine skews the figures)",
        f"python:    {platform.python_implementation()} {platform.python_version()}",
        f"packages:  {_versions(('tuneforge', 'fastapi', 'starlette', 'uvicorn', 'pydantic', 'sqlalchemy'))}",
        f"           {_versions(('psycopg', 'httpx', 'httptools', 'uvloop', 'torch', 'transformers', 'peft'))}",
        f"database:  {database}{sqlite_note}",
        f"tuneforge: git {_git_revision()}",
    ]
