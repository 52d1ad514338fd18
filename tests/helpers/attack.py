"""A real `tuneforge up` (API workers in their own processes, scheduler, local executor) for the
attack suite, and a watch that measures what an attack costs everyone else.

`LiveServer.start(tmp_path, model_dir)` prepares a home on SQLite with two tenants — `attacker`
(on the free tier unless told otherwise) and `bystander` (premium, so that the watch's polling stays
under its rate limit) — and the tiny model registered as
`tiny-chat`, then starts `python -m tuneforge.cli.main up --workers N` on a free port.

`with server.watch() as watch:` samples, every `interval_s`, the memory of the server's
whole process tree (proportional set sizes, from /proc) and the latency of one cheap authenticated request by the
bystander (`GET /v1/models`). After the block, `watch.rss_growth_bytes` (peak minus the figure at
the start), `watch.bystander_max_s`, `watch.bystander_p50_s` and `watch.bystander_failures` say
what the attack did to the server and to the other tenant.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx

from tests.helpers.net import free_port, wait_for_http
from tests.helpers.platform import add_base_model, add_tenant, make_platform
from tuneforge.services.context import Platform
from tuneforge.settings import Settings

MODEL_NAME = "tiny-chat"


def _proportional_bytes(pid: int, rss_bytes: int) -> int:
    """The process's proportional set size (each page shared with N processes counts 1/N): a
    trainer forked from the warm trainer shares most of its pages with it, and the resident set
    of each would count them twice. Its resident set where the kernel gives no PSS."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return rss_bytes


def process_tree_rss_bytes(root_pid: int) -> int:
    """Memory of `root_pid` and all its descendants, read from /proc: the sum of their
    proportional set sizes (`_proportional_bytes`)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    page = os.sysconf("SC_PAGE_SIZE")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as handle:
                stat = handle.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        pid, ppid = int(entry), int(fields[1])
        children.setdefault(ppid, []).append(pid)
        rss[pid] = int(fields[21]) * page
    total, stack = 0, [root_pid]
    while stack:
        pid = stack.pop()
        if pid in rss:
            total += _proportional_bytes(pid, rss[pid])
        stack.extend(children.get(pid, ()))
    return total


@dataclass
class Watch:
    """What an attack did while it ran: the server's memory and the bystander's latency."""

    server: LiveServer
    interval_s: float = 0.1
    rss_start_bytes: int = 0
    rss_peak_bytes: int = 0
    latencies_s: list[float] = field(default_factory=list)
    bystander_failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Watch:
        self.rss_start_bytes = self.rss_peak_bytes = process_tree_rss_bytes(self.server.process.pid)
        self._thread = threading.Thread(target=self._run, name="attack-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(120)

    def _run(self) -> None:
        headers = {"Authorization": f"Bearer {self.server.bystander_key}"}
        with httpx.Client(base_url=self.server.url, timeout=300) as client:
            while not self._stop.is_set():
                self.rss_peak_bytes = max(self.rss_peak_bytes, process_tree_rss_bytes(self.server.process.pid))
                started = time.monotonic()
                try:
                    answer = client.get("/v1/models", headers=headers)
                    if answer.status_code != 200:
                        self.bystander_failures.append(f"HTTP {answer.status_code}: {answer.text[:200]}")
                except httpx.HTTPError as exc:
                    self.bystander_failures.append(f"{type(exc).__name__}: {exc}")
                self.latencies_s.append(time.monotonic() - started)
                self._stop.wait(self.interval_s)

    @property
    def rss_growth_bytes(self) -> int:
        return max(0, self.rss_peak_bytes - self.rss_start_bytes)

    @property
    def bystander_max_s(self) -> float:
        return max(self.latencies_s, default=0.0)

    @property
    def bystander_p50_s(self) -> float:
        return statistics.median(self.latencies_s) if self.latencies_s else 0.0

    def summary(self) -> str:
        return (f"rss +{self.rss_growth_bytes / 2**20:.1f} MiB, bystander p50 {self.bystander_p50_s * 1000:.0f} ms "
                f"max {self.bystander_max_s * 1000:.0f} ms over {len(self.latencies_s)} requests, "
                f"{len(self.bystander_failures)} failed")


@dataclass
class LiveServer:
    process: subprocess.Popen
    url: str
    home: Path
    attacker_key: str
    bystander_key: str
    log_path: Path

    @classmethod
    def start(cls, tmp_path: Path, model_dir: Path, *, workers: int = 2, tier: str = "free",
              env: dict[str, str] | None = None, timeout_s: float = 90.0) -> LiveServer:
        home = tmp_path / "home"
        database_url = f"sqlite:///{(home / 'tuneforge.db').resolve()}"
        home.mkdir(parents=True, exist_ok=True)
        platform = make_platform(tmp_path, database_url)
        try:
            attacker = add_tenant(platform, "attacker", tier)
            bystander = add_tenant(platform, "bystander", "premium")  # its own polling stays under its rate
            add_base_model(platform, MODEL_NAME, model_dir)
        finally:
            platform.db.dispose()
        port = free_port()
        # an attack server trains one job at most: its trainer starts cold rather than keeping one warm
        child_env = {**os.environ, "TUNEFORGE_HOME": str(home), "TUNEFORGE_DATABASE_URL": database_url,
                     "TUNEFORGE_EVAL_BY_DEFAULT": "false", "TUNEFORGE_TRAINER_WARM_START": "false", **(env or {})}
        log_path = tmp_path / "server.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "tuneforge.cli.main", "up", "--host", "127.0.0.1", "--port", str(port),
                 "--workers", str(workers)],
                env=child_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        server = cls(process, url, home, attacker, bystander, log_path)
        try:
            wait_for_http(f"{url}/healthz", timeout_s=timeout_s, alive=lambda: process.poll() is None)
            # every worker has imported its routes once a few requests have been answered
            with httpx.Client(base_url=url, timeout=60) as client:
                for _ in range(4 * workers):
                    client.get("/v1/models", headers={"Authorization": f"Bearer {bystander}"})
        except BaseException:
            server.stop()
            raise
        return server

    def with_new_tenants(self, label: str, tier: str = "free") -> LiveServer:
        """The same server seen by an attacker and a bystander of their own (`attacker-LABEL` on
        `tier`, `bystander-LABEL` premium), made in its database while it runs: what one test
        module's attacks spent (rate windows, quotas, queued work) is not the next module's."""
        settings = Settings(home=self.home, database_url=f"sqlite:///{(self.home / 'tuneforge.db').resolve()}")
        platform = Platform.from_settings(settings)
        try:
            attacker = add_tenant(platform, f"attacker-{label}", tier)
            bystander = add_tenant(platform, f"bystander-{label}", "premium")
        finally:
            platform.db.dispose()
        return replace(self, attacker_key=attacker, bystander_key=bystander)

    def client(self, key: str | None = None, timeout_s: float = 120.0) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s)

    def watch(self, interval_s: float = 0.1) -> Watch:
        return Watch(self, interval_s)

    def alive(self) -> bool:
        return self.process.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
