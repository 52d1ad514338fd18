"""The client-only install (`pip install -e .`, no extras) runs an operator command: one line
naming the extra to install, exit 2, no traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

# what the client-only install lacks: the server's and the trainer's packages
BLOCKED = ("sqlalchemy", "alembic", "fastapi", "starlette", "uvicorn", "torch", "transformers", "peft", "ray")
RUN = f"""
import importlib.abc, sys
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {BLOCKED!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, Absent())
from tuneforge.cli.main import main
main(sys.argv[1:])
"""


def _run(tmp_path, *args: str) -> subprocess.CompletedProcess:
    env = {"TUNEFORGE_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    return subprocess.run([sys.executable, "-c", RUN, *args], capture_output=True, text=True, timeout=120,
                          env=env, cwd=tmp_path)


@pytest.mark.parametrize("args", [("up",), ("init",), ("tenants", "list"), ("base-models", "list"),
                                  ("files", "validate", "train.jsonl", "--model", "tiny")])
def test_an_operator_command_without_the_server_extra_names_the_extra_in_one_line(tmp_path, args) -> None:
    (tmp_path / "train.jsonl").write_text('{"messages": []}\n')
    done = _run(tmp_path, *args)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert "Traceback" not in done.stderr and len([line for line in lines if line.startswith("error:")]) == 1
    assert "needs tuneforge's [server] extra" in lines[-1] and "pip install -e '.[server]'" in lines[-1]


def test_a_tenant_command_still_runs_on_the_client_install(tmp_path) -> None:
    done = _run(tmp_path, "--version")
    assert done.returncode == 0 and done.stdout.strip()
