"""A large file through the Uploads API: does the server's memory stay flat?

    python benchmarks/upload_memory.py [--gib 3] [--purpose user_data] [--part-mib 64] [--skip-baseline]

Goal (issue: OpenAI parity, Uploads): a 3 GB file sent with the official SDK's
`client.uploads.upload_file_chunked` (64 MiB parts) while the server's
resident memory stays under 300 MB above what it was idle. Printed as a
PASS/FAIL line, never asserted.

Setup: a fresh home built through the real CLI, `tuneforge serve
--no-scheduler` as a separate process (SQLite, a local object store), one
premium-tier tenant (files up to 8 GiB). The file is random bytes written to a
temporary folder first; its md5 is sent with `complete`, so the server checks
every byte of the assembled file.

Measured: the server process's RSS sampled every 20 ms from /proc (idle:
after one request warmed it up; peak: the highest sample during the upload),
the wall time and MB/s, and the stored file's size and sha256 against the
source's. Baseline, in the same run: the same file through the single-request
`client.files.create` (one multipart body), the way a user without the Uploads
API sends it.

Traffic goes to 127.0.0.1 only; the server is stopped and the temporary folder
removed on exit.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import threading
import time
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import BenchHome, ServerProcess  # noqa: E402

GOAL_MB = 300.0
_CHUNK = 16 * 1024 * 1024


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class RssSampler:
    """The highest RSS of `pid` seen while the `with` block runs."""

    def __init__(self, pid: int, every_s: float = 0.02) -> None:
        self.pid = pid
        self.every_s = every_s
        self.peak_mb = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak_mb = max(self.peak_mb, rss_mb(self.pid))
            self._stop.wait(self.every_s)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_mb = max(self.peak_mb, rss_mb(self.pid))


def write_source(path: Path, size: int) -> tuple[str, str]:
    """`size` random bytes at `path`; their (md5, sha256)."""
    md5, sha256 = hashlib.md5(usedforsecurity=False), hashlib.sha256()
    with open(path, "wb") as handle:
        left = size
        while left:
            block = os.urandom(min(_CHUNK, left))
            md5.update(block)
            sha256.update(block)
            handle.write(block)
            left -= len(block)
    return md5.hexdigest(), sha256.hexdigest()


def stored_sha256(client: openai.OpenAI, file_id: str) -> str:
    digest = hashlib.sha256()
    with client.files.with_streaming_response.content(file_id) as response:
        for chunk in response.iter_bytes(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def run(args: argparse.Namespace) -> int:
    size = int(args.gib * 1024 ** 3)
    home = BenchHome()
    try:
        home.cli("migrate")
        key = home.cli("tenants", "create", "bulk", "--tier", "premium").strip().splitlines()[-1].strip()
        source = home.root / "source.bin"
        started = time.monotonic()
        md5, sha256 = write_source(source, size)
        print(f"source: {size / 1e9:.2f} GB of random bytes written in {time.monotonic() - started:.1f}s")
        with ServerProcess(home, scheduler=False) as server:
            client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0, timeout=3600)
            client.files.list()  # warm: imports, the first connection, the key cache
            time.sleep(1.0)
            idle = rss_mb(server.proc.pid)
            print(f"server: {server.command_line}")
            print(f"server RSS idle: {idle:.0f} MB")
            rows = []

            started = time.monotonic()
            with RssSampler(server.proc.pid) as sampler:
                upload = client.uploads.upload_file_chunked(
                    file=source, mime_type="application/octet-stream", purpose=args.purpose,
                    part_size=args.part_mib * 1024 * 1024, md5=md5)
            elapsed = time.monotonic() - started
            assert upload.status == "completed" and upload.file is not None, upload
            same = upload.file.bytes == size and stored_sha256(client, upload.file.id) == sha256
            rows.append(("uploads.upload_file_chunked", elapsed, sampler.peak_mb, same))
            client.files.delete(upload.file.id)

            if not args.skip_baseline:
                time.sleep(1.0)
                started = time.monotonic()
                with RssSampler(server.proc.pid) as sampler, open(source, "rb") as handle:
                    file = client.files.create(file=("source.bin", handle), purpose=args.purpose)
                elapsed = time.monotonic() - started
                same = file.bytes == size and stored_sha256(client, file.id) == sha256
                rows.append(("files.create (baseline)", elapsed, sampler.peak_mb, same))

        print(f"\n{'path':<30} {'seconds':>8} {'MB/s':>7} {'peak RSS':>9} {'over idle':>10}  bytes intact")
        for name, seconds, peak, same in rows:
            print(f"{name:<30} {seconds:8.1f} {size / 1e6 / seconds:7.0f} {peak:8.0f}M {peak - idle:9.0f}M  {same}")
        over = rows[0][2] - idle
        verdict = "PASS" if over < GOAL_MB and rows[0][3] else "FAIL"
        print(f"\n{verdict}: the Uploads API held {over:.0f} MB over idle for {size / 1e9:.2f} GB "
              f"(goal: under {GOAL_MB:.0f} MB)")
        return 0
    finally:
        home.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=3.0, help="size of the file in GiB (default 3)")
    parser.add_argument("--purpose", default="user_data", help="the files' purpose (default user_data: stored, "
                                                              "not validated as training data)")
    parser.add_argument("--part-mib", type=int, default=64, help="part size in MiB (default 64, the SDK's)")
    parser.add_argument("--skip-baseline", action="store_true", help="only the Uploads API")
    return run(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
