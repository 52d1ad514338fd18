"""Nothing the platform prints or logs shows a password or a secret query value."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tuneforge.security.redact import redact_url


@pytest.mark.parametrize("url, shown", [
    ("postgresql+psycopg://app:hunter2@db.internal:5432/tuneforge",
     "postgresql+psycopg://app:***@db.internal:5432/tuneforge"),
    ("postgresql://app:p%40ss%3Aword@db/tf?sslmode=require", "postgresql://app:***@db/tf?sslmode=require"),
    ("postgresql://app:p@ss@db/tf", "postgresql://app:***@db/tf"),  # an unescaped '@' in the password
    ("postgresql://app@db/tf?password=hunter2&sslmode=verify-full",
     "postgresql://app@db/tf?password=***&sslmode=verify-full"),
    ("postgresql://app:@db/tf", "postgresql://app:***@db/tf"),
    ("s3://AKIAEXAMPLE:wJalrXUtnFEMI@bucket/prefix", "s3://AKIAEXAMPLE:***@bucket/prefix"),
    ("https://minio:9000/bucket/k?X-Amz-Credential=AKIA%2F2024&X-Amz-Signature=abc123&X-Amz-Expires=60",
     "https://minio:9000/bucket/k?X-Amz-Credential=***&X-Amz-Signature=***&X-Amz-Expires=60"),
    ("http://h/x?access_token=t0k&api_key=k3y&sig=s1g&page=2", "http://h/x?access_token=***&api_key=***&sig=***&page=2"),
    ("https://user:pw@example.com:8443/a/b#frag", "https://user:***@example.com:8443/a/b#frag"),
    ("sqlite:////var/lib/tuneforge/tuneforge.db", "sqlite:////var/lib/tuneforge/tuneforge.db"),
    ("s3://bucket/prefix", "s3://bucket/prefix"),
    ("/srv/tuneforge/objects", "/srv/tuneforge/objects"),
    ("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
    ("", ""),
    ("sqlite://", "sqlite://"),
])
def test_redact_url(url, shown):
    assert redact_url(url) == shown


def test_secrets_never_survive_whatever_the_shape():
    for url in ("mysql+pymysql://u:hunter2@h:3306/d?charset=utf8", "redis://:hunter2@cache:6379/0",
                "postgresql://u:hunter2@[::1]:5432/d", "http://h/?Password=hunter2", "http://h/?token=hunter2&token=x"):
        assert "hunter2" not in redact_url(url), url


def test_a_malformed_host_still_loses_its_password():
    assert redact_url("http://[broken:pw@host/") == "http://[broken:***@host/"


def test_serve_prints_where_the_database_is_without_its_password(tmp_path):
    """`tuneforge serve` names its database and object store on start, without their passwords.
    The control plane is a stand-in that stops where the real one would start serving."""
    script = (
        "import sys\n"
        "import tuneforge.server as server\n"
        "class Stop(Exception): pass\n"
        "class Plane:\n"
        "    def __init__(self, settings, run_scheduler): self.url = settings.resolved_public_url\n"
        "    def serve_forever(self): raise Stop\n"
        "server.ControlPlane = Plane\n"
        "from tuneforge.cli.main import app\n"
        "try:\n"
        "    app(['serve', '--port', '8123'])\n"
        "except Stop:\n"
        "    sys.exit(0)\n"
    )
    env = {**os.environ, "TUNEFORGE_HOME": str(tmp_path / "home"),
           "TUNEFORGE_DATABASE_URL": "postgresql+psycopg://tuneforge:hunter2-db@db.invalid:5432/tf",
           "TUNEFORGE_STORAGE_URL": "s3://AKIAEXAMPLE:hunter2-s3@bucket/prefix",
           "TUNEFORGE_ADMIN_API_KEY": "hunter2-admin", "TUNEFORGE_S3_SECRET_ACCESS_KEY": "hunter2-s3key"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "postgresql+psycopg://tuneforge:***@db.invalid:5432/tf" in output
    assert "s3://AKIAEXAMPLE:***@bucket/prefix" in output
    assert "hunter2" not in output
