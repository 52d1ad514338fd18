"""`pip install tuneforge` (no extras) into a fresh virtual environment: the command line and API
client alone — no torch, no server packages — and it works: `--version`, and a server that cannot
be reached is one line and exit code 3."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# the install does not depend on the executor: it runs once, in the sqlite stage
pytestmark = pytest.mark.skipif(os.environ.get("TUNEFORGE_TEST_EXECUTOR") == "ray", reason="runs in the sqlite stage")

ROOT = Path(__file__).resolve().parents[2]


def test_the_bare_package_installs_light_and_runs(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    installed = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                                str(ROOT)], capture_output=True, text=True, timeout=900)
    assert installed.returncode == 0, installed.stderr[-2000:]
    listed = subprocess.run([str(python), "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True,
                            check=True, timeout=120).stdout
    names = {line.split("==")[0].lower() for line in listed.splitlines()}
    assert not names & {"torch", "transformers", "fastapi", "sqlalchemy", "numpy", "ray", "openai"}, names
    assert len(names) < 40, sorted(names)
    tuneforge = venv / "bin" / "tuneforge"
    version = subprocess.run([str(tuneforge), "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and version.stdout.startswith("tuneforge "), version.stderr
    env = {**os.environ, "TUNEFORGE_BASE_URL": "http://127.0.0.1:9/v1", "TUNEFORGE_API_KEY": "tf-x"}
    down = subprocess.run([str(tuneforge), "jobs", "list"], capture_output=True, text=True, timeout=60, env=env)
    assert down.returncode == 3 and down.stderr.count("\n") == 1 and "connection refused" in down.stderr, down.stderr
