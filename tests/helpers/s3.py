"""A moto S3 server in a subprocess, and buckets on it for tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from tests.helpers.net import free_port, wait_for_http
from tuneforge.executors.ray_host import parent_death_hook

REGION = "us-east-1"
ACCESS_KEY_ID = "testing"
SECRET_ACCESS_KEY = "testing"

# Dummy credentials so that no test can reach a real account by accident.
AWS_ENV = {
    "AWS_ACCESS_KEY_ID": ACCESS_KEY_ID,
    "AWS_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY,
    "AWS_SECURITY_TOKEN": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": REGION,
}


@dataclass
class MotoServer:
    endpoint_url: str
    process: subprocess.Popen
    log_path: Path

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout_s: float = 5.0) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_moto_server(log_dir: Path, start_timeout_s: float = 30.0, tries: int = 3) -> MotoServer:
    """Start `python -m moto.server` on a free port and wait until it answers.

    Retried on a fresh port: the port chosen may be taken between choosing and binding.
    """
    last_error: Exception | None = None
    for attempt in range(tries):
        port = free_port()
        log_path = Path(log_dir) / f"moto-{port}.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **AWS_ENV},
                # SIGTERM to the server if pytest dies without its teardown
                preexec_fn=parent_death_hook(signal.SIGTERM),  # noqa: PLW1509 (only calls prctl)
            )
        server = MotoServer(f"http://127.0.0.1:{port}", process, log_path)
        try:
            wait_for_http(
                f"{server.endpoint_url}/moto-api/", start_timeout_s, alive=server.alive
            )
            return server
        except (TimeoutError, RuntimeError) as exc:
            server.stop()
            log_tail = log_path.read_text(errors="replace")[-2000:]
            last_error = RuntimeError(f"moto server attempt {attempt + 1}: {exc}\n{log_tail}")
    assert last_error is not None
    raise last_error


@dataclass
class S3Storage:
    """One fresh bucket: where a store points and how to reach it."""

    bucket: str
    prefix: str
    endpoint_url: str
    region: str = REGION
    key: str = ACCESS_KEY_ID
    secret: str = SECRET_ACCESS_KEY
    url: str = field(init=False)
    options: dict = field(init=False)
    env: dict[str, str] = field(init=False)

    def __post_init__(self) -> None:
        self.url = f"s3://{self.bucket}/{self.prefix}"
        # fsspec/s3fs storage options, as Settings.storage_options() builds them.
        self.options = {
            "client_kwargs": {"endpoint_url": self.endpoint_url, "region_name": self.region},
            "key": self.key,
            "secret": self.secret,
        }
        # The same place, as tuneforge settings read it from the environment.
        self.env = {
            "TUNEFORGE_STORAGE_URL": self.url,
            "TUNEFORGE_S3_ENDPOINT_URL": self.endpoint_url,
            "TUNEFORGE_S3_REGION": self.region,
            "TUNEFORGE_S3_ACCESS_KEY_ID": self.key,
            "TUNEFORGE_S3_SECRET_ACCESS_KEY": self.secret,
        }

    def client(self):
        """A boto3 S3 client for the bucket's server, to check objects directly."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=self.region,
            aws_access_key_id=self.key,
            aws_secret_access_key=self.secret,
        )


def create_bucket(endpoint_url: str, prefix: str = "objects") -> S3Storage:
    storage = S3Storage(bucket=f"tf-test-{uuid.uuid4().hex[:16]}", prefix=prefix, endpoint_url=endpoint_url)
    storage.client().create_bucket(Bucket=storage.bucket)
    return storage
