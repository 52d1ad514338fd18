"""Attack: what an anonymous client (or a tenant) can make the edge do with a body.

Before the fix, the guard read and parsed every body before a route looked at the key: two
anonymous 16 MiB JSON arrays (`[0,0,...]`, 8 million values) froze both API workers for about
50 s and added GBs of RSS, and an anonymous upload was spooled to disk (8 GiB allowed) before its
401. Now the key (admin key, job token) is checked from the headers first and the body is never
read without it; an authenticated body is counted before it is parsed (413 beyond
MAX_JSON_VALUES values), and a large one is checked in a thread.

Against a real `tuneforge up` (two API workers, SQLite), its temporary directory pointed at a
folder this module watches; each request is sent over a raw socket, so the figures say how many
bytes the server let in before it answered.
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import pytest

from tests.helpers.attack import LiveServer

# `[0,0,...,0]` of just under the JSON body limit (odd, so that it ends in a value): 8 million values
ARRAY_BYTES = 16 * 1024 * 1024 - 1
UPLOAD_BYTES = 256 * 1024 * 1024  # what the attacker saw spooled before the fix
CHUNK_BYTES = 1024 * 1024
# Bounds, generous for a loaded 2-core CI machine (before the fix: 401 after ~50 s, RSS +3 GB,
# bystander frozen for the whole of it)
ANONYMOUS_ANSWER_BOUND_S = 2.0  # a header check and a key look-up
TENANT_ANSWER_BOUND_S = 5.0  # the body read and counted (no parse)
BYSTANDER_BOUND_S = 1.5  # the bystander's GET /v1/models during the attack
RSS_GROWTH_BOUND_BYTES = 96 * 2**20  # the bodies a worker holds at once, and allocator slack
BODY_LET_IN_BOUND_BYTES = 8 * 2**20  # what TCP buffers take before the server's answer is seen
WATCH_AFTER_S = 1.0  # the watch goes on this long after the attack: the bystander's figures need samples
SPOOL_BOUND_BYTES = 1 * 2**20  # nothing of an anonymous upload reaches disk


@dataclass
class RawAnswer:
    status: int
    text: str
    sent_bytes: int
    elapsed_s: float


def _pieces(head: bytes, total_bytes: int, filler: bytes, tail: bytes) -> Iterator[bytes]:
    """`head`, then `filler` repeated, then `tail`: `total_bytes` in all."""
    yield head
    left = total_bytes - len(head) - len(tail)
    while left > 0:
        piece = filler[:left]
        left -= len(piece)
        yield piece
    yield tail


def raw_post(url: str, path: str, headers: dict[str, str], total_bytes: int, pieces: Iterator[bytes],
             timeout_s: float = 120.0) -> RawAnswer:
    """POST a declared `total_bytes` body piece by piece, stopping as soon as the server answers."""
    parsed = urlparse(url)
    started = time.monotonic()
    sock = socket.create_connection((parsed.hostname, parsed.port), timeout=timeout_s)
    head = f"POST {path} HTTP/1.1\r\nHost: {parsed.netloc}\r\nContent-Length: {total_bytes}\r\nConnection: close\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in headers.items()) + "\r\n"
    sock.sendall(head.encode())
    sent, pending, received = 0, b"", b""
    sock.setblocking(False)
    try:
        while time.monotonic() - started < timeout_s:
            if not pending:
                pending = next(pieces, b"")
            readable, writable, _ = select.select([sock], [sock] if pending else [], [], 1.0)
            if readable:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                received += chunk
                if b"\r\n\r\n" in received and _complete(received):
                    break
            elif writable:
                try:
                    count = sock.send(pending)
                except (BrokenPipeError, ConnectionResetError):
                    pending = b""
                    sock.setblocking(True)
                    received += _read_rest(sock)
                    break
                sent += count
                pending = pending[count:]
    finally:
        sock.close()
    elapsed_s = time.monotonic() - started
    status_line, _, rest = received.partition(b"\r\n")
    status = int(status_line.split()[1]) if status_line.startswith(b"HTTP/") else 0
    return RawAnswer(status, rest.partition(b"\r\n\r\n")[2].decode(errors="replace"), sent, elapsed_s)


def _complete(received: bytes) -> bool:
    headers, _, body = received.partition(b"\r\n\r\n")
    for line in headers.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return False


def _read_rest(sock: socket.socket) -> bytes:
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except OSError:
        pass
    return data


def _descendants(root_pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as handle:
                    stat = handle.read()
            except OSError:
                continue
            children.setdefault(int(stat[stat.rfind(")") + 2:].split()[1]), []).append(int(entry))
    found, stack = [], [root_pid]
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, ()))
    return found


class DiskWatch:
    """The largest total size, while the block runs, of the files under `folders` and of the files
    the server's processes hold open there (a spooled upload is an unnamed O_TMPFILE on Linux,
    seen only through /proc/PID/fd)."""

    def __init__(self, server_pid: int, *folders: Path) -> None:
        self.server_pid = server_pid
        self.folders = [str(folder.resolve()) for folder in folders]
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _size(self) -> int:
        total, seen = 0, set()
        for folder in self.folders:
            for root, _dirs, files in os.walk(folder):
                for name in files:
                    try:
                        stat = os.stat(os.path.join(root, name))
                    except OSError:
                        continue
                    seen.add((stat.st_dev, stat.st_ino))
                    total += stat.st_size
        for pid in _descendants(self.server_pid):
            try:
                descriptors = os.listdir(f"/proc/{pid}/fd")
            except OSError:
                continue
            for fd in descriptors:
                try:
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if not target.startswith(tuple(self.folders)):
                        continue
                    stat = os.stat(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if (stat.st_dev, stat.st_ino) not in seen:
                    seen.add((stat.st_dev, stat.st_ino))
                    total += stat.st_size
        return total

    def _run(self) -> None:
        start = self._size()
        while not self._stop.is_set():
            self.peak_bytes = max(self.peak_bytes, self._size() - start)
            self._stop.wait(0.05)

    def __enter__(self) -> DiskWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)


@pytest.fixture(scope="module")
def spool(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("spool")


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir, spool) -> Iterator[LiveServer]:
    """The suite's server, with its temporary files (multipart spooling) in `spool`."""
    server = LiveServer.start(tmp_path_factory.mktemp("live"), tiny_model_dir,
                              env={"TMPDIR": str(spool), "TUNEFORGE_ADMIN_API_KEY": "admin-key-of-the-edge-attack"})
    yield server
    server.stop()


def _array_pieces() -> Iterator[bytes]:
    return _pieces(b"[0", ARRAY_BYTES, b",0" * (CHUNK_BYTES // 2), b"]")


def anonymous_arrays(live: LiveServer, paths: list[str]) -> list[RawAnswer]:
    """Two anonymous 16 MiB arrays at once to each of `paths`."""
    answers: list[RawAnswer] = []

    def send(path: str) -> None:
        answers.append(raw_post(live.url, path, {"Content-Type": "application/json"}, ARRAY_BYTES, _array_pieces()))

    for path in paths:
        threads = [threading.Thread(target=send, args=(path,)) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return answers


ROUTES = ["/v1/fine_tuning/jobs", "/v1/chat/completions", "/v1/webhooks", "/v1/admin/tenants",
          "/internal/v1/jobs/ftjob-x/heartbeat"]


def test_anonymous_arrays_are_401_before_the_body_is_read(live):
    with live.watch() as watch:
        answers = anonymous_arrays(live, ROUTES)
        time.sleep(WATCH_AFTER_S)
    print(f"\nanonymous 16 MiB arrays x{len(answers)}: {watch.summary()}; slowest answer "
          f"{max(a.elapsed_s for a in answers):.2f} s; most body let in {max(a.sent_bytes for a in answers)} B")
    assert [a.status for a in answers] == [401] * len(answers), [a.text for a in answers]
    assert all('"type":"invalid_request_error"' in a.text for a in answers)
    assert max(a.elapsed_s for a in answers) < ANONYMOUS_ANSWER_BOUND_S
    assert max(a.sent_bytes for a in answers) < BODY_LET_IN_BOUND_BYTES
    assert live.alive() and not watch.bystander_failures and len(watch.latencies_s) >= 3
    assert watch.bystander_max_s < BYSTANDER_BOUND_S
    assert watch.rss_growth_bytes < RSS_GROWTH_BOUND_BYTES


def test_a_tenants_array_is_counted_not_parsed(live):
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {live.attacker_key}"}
    answers: list[RawAnswer] = []

    def send() -> None:
        answers.append(raw_post(live.url, "/v1/fine_tuning/jobs", headers, ARRAY_BYTES, _array_pieces()))

    with live.watch() as watch:
        threads = [threading.Thread(target=send) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        time.sleep(WATCH_AFTER_S)
    print(f"\ntenant 16 MiB arrays x2: {watch.summary()}; slowest answer {max(a.elapsed_s for a in answers):.2f} s")
    assert [a.status for a in answers] == [413, 413], [a.text for a in answers]
    assert all("json_too_many_values" in a.text for a in answers)
    assert max(a.elapsed_s for a in answers) < TENANT_ANSWER_BOUND_S
    assert live.alive() and not watch.bystander_failures and len(watch.latencies_s) >= 3
    assert watch.bystander_max_s < BYSTANDER_BOUND_S
    assert watch.rss_growth_bytes < RSS_GROWTH_BOUND_BYTES


def test_an_anonymous_upload_is_401_before_anything_is_spooled(live, spool):
    boundary = "edgeattack"
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nfine-tune\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"big.jsonl\"\r\n"
            "Content-Type: application/octet-stream\r\n\r\n").encode()
    tail = f"\r\n--{boundary}--\r\n".encode()
    pieces = _pieces(head, UPLOAD_BYTES, b"x" * CHUNK_BYTES, tail)
    with DiskWatch(live.process.pid, spool, live.home) as disk, live.watch() as watch:
        answer = raw_post(live.url, "/v1/files", {"Content-Type": f"multipart/form-data; boundary={boundary}"},
                          UPLOAD_BYTES, pieces)
        time.sleep(WATCH_AFTER_S)
    print(f"\nanonymous {UPLOAD_BYTES >> 20} MiB upload: {answer.status} after {answer.elapsed_s:.2f} s, "
          f"{answer.sent_bytes} B let in, disk +{disk.peak_bytes} B; {watch.summary()}")
    assert answer.status == 401 and "missing_api_key" in answer.text
    assert answer.elapsed_s < ANONYMOUS_ANSWER_BOUND_S
    assert answer.sent_bytes < BODY_LET_IN_BOUND_BYTES
    assert disk.peak_bytes < SPOOL_BOUND_BYTES
    assert live.alive() and not watch.bystander_failures and len(watch.latencies_s) >= 3
    assert watch.bystander_max_s < BYSTANDER_BOUND_S
    assert watch.rss_growth_bytes < RSS_GROWTH_BOUND_BYTES


def test_a_tenants_bodies_at_the_value_limit_cost_a_bounded_parse(live):
    """What still passes the count is parsed (by the check in a thread, then by the route on the
    loop): at most MAX_JSON_VALUES values, a bounded cost; here two such bodies at once."""
    from tuneforge.api.limits import MAX_JSON_VALUES

    body = b"[" + b",".join([b"1"] * (MAX_JSON_VALUES - 1)) + b"]"
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {live.attacker_key}"}
    answers: list[RawAnswer] = []

    def send() -> None:
        answers.append(raw_post(live.url, "/v1/fine_tuning/jobs", headers, len(body), iter([body])))

    with live.watch() as watch:
        threads = [threading.Thread(target=send) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        time.sleep(WATCH_AFTER_S)
    print(f"\ntenant bodies of {MAX_JSON_VALUES - 1} values x2: {[a.status for a in answers]}; {watch.summary()}; "
          f"slowest answer {max(a.elapsed_s for a in answers):.2f} s")
    assert [a.status for a in answers] == [400, 400], [a.text for a in answers]  # a job body is an object
    assert max(a.elapsed_s for a in answers) < TENANT_ANSWER_BOUND_S
    assert live.alive() and not watch.bystander_failures and len(watch.latencies_s) >= 3
    assert watch.bystander_max_s < BYSTANDER_BOUND_S
    assert watch.rss_growth_bytes < RSS_GROWTH_BOUND_BYTES
