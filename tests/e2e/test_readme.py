"""The README's "Using it", run as written on a fresh home: every command and Python block of the
section, in order, against the control plane its own `tuneforge up` starts. Only what cannot run
here is replaced: the installs are skipped (this environment has them), port 8000 becomes a free
port, the placeholders (`tf-...`, `ftjob-...`, `ft:tiny:acme:...`) become the values the earlier
commands printed, and the demo's tiny model (which the README registers from the folder the demo
leaves) is put where the demo would have left it. The outcomes the README promises are asserted:
the job learns the example's facts and the fine-tuned model answers them, and most of the held-out
questions (the same facts in wordings the training file never pairs with them)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.helpers.net import free_port

REPO = Path(__file__).resolve().parents[2]
SECTION = "## Using it"
# `tuneforge` as the installed console script runs it, whatever PATH holds
PRELUDE = 'tuneforge() { exec "$TUNEFORGE_TEST_PYTHON" -m tuneforge.cli.main "$@"; }\n'

pytestmark = pytest.mark.sqlite_pass_only  # the README's own embedded defaults


def readme_blocks() -> list[tuple[str, str]]:
    """(language, code) of every fenced block of the section, in order."""
    text = (REPO / "README.md").read_text()
    section = text[text.index(SECTION):]
    section = section[:section.index("\n## ", len(SECTION))]
    return re.findall(r"```(\w+)\n(.*?)```", section, flags=re.S)


class Reader:
    """Runs the README's lines as a user's shell would, with the substitutions said above."""

    def __init__(self, tmp_path: Path) -> None:
        self.cwd = tmp_path / "work"
        shutil.copytree(REPO / "examples", self.cwd / "examples")
        self.user = tmp_path / "user"
        self.port = free_port()
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("TUNEFORGE_") and k != "XDG_DATA_HOME"}
        self.env.update(HOME=str(self.user), TUNEFORGE_TEST_PYTHON=sys.executable)
        self.values: dict[str, str] = {"8000": str(self.port)}
        self.server: subprocess.Popen | None = None

    def filled(self, code: str) -> str:
        for placeholder, value in self.values.items():
            code = code.replace(placeholder, value)
        return code

    def run(self, line: str) -> subprocess.CompletedProcess:
        done = subprocess.run(["bash", "-c", PRELUDE + self.filled(line)], cwd=self.cwd, env=self.env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
        assert "Traceback" not in done.stderr, done.stderr
        return done

    def start(self, line: str) -> None:
        """A line ending in `&`: the server, left running."""
        log = open(self.cwd / "server.log", "w")  # noqa: SIM115 - closed with the process
        self.server = subprocess.Popen(["bash", "-c", PRELUDE + self.filled(line.rstrip("& "))], cwd=self.cwd,
                                       env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 90
        while True:
            assert self.server.poll() is None, (self.cwd / "server.log").read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/healthz", timeout=2, trust_env=False).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, (self.cwd / "server.log").read_text()
            time.sleep(0.3)

    def stop(self) -> None:
        if self.server is not None and self.server.poll() is None:
            os.killpg(self.server.pid, signal.SIGTERM)
            try:
                self.server.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.server.pid, signal.SIGKILL)
                self.server.wait(10)


def shell_lines(code: str) -> list[str]:
    """A block's commands: its lines, a trailing backslash joining the next."""
    return [line for line in code.replace("\\\n", " ").splitlines() if line.strip()]


def test_the_readmes_using_it_runs_as_written_and_the_model_answers(tmp_path, tiny_model_dir, capsys,
                                                                    monkeypatch) -> None:
    blocks = readme_blocks()
    assert [language for language, _ in blocks] == ["bash", "python", "bash", "python", "bash"]
    reader = Reader(tmp_path)
    # where the README's `base-models add` finds the demo's model: the folder the demo leaves
    demo_model = reader.user / ".local" / "share" / "tuneforge" / "demo" / "models" / "tiny-chat"
    shutil.copytree(tiny_model_dir, demo_model)
    namespace: dict = {}
    monkeypatch.chdir(reader.cwd)
    try:
        # 1. install (skipped: installed here), init, up, a tenant, the base model
        for line in shell_lines(blocks[0][1]):
            if line.startswith("pip install"):
                continue
            if line.split("#")[0].rstrip().endswith("&"):
                reader.start(line.split("#")[0])
                continue
            done = reader.run(line)
            if " tenants create " in f" {line} ":
                reader.values["tf-..."] = done.stdout.strip().splitlines()[-1]
        assert reader.values["tf-..."].startswith("tf-")

        # 2. the SDK: upload, create, wait, the last events
        exec(compile(reader.filled(blocks[1][1]), "README.md (python)", "exec"), namespace)  # noqa: S102
        job = namespace["job"]
        printed = capsys.readouterr().out
        assert job.status == "succeeded", job.error
        assert f"succeeded {job.fine_tuned_model}" in printed and "The job has successfully completed" in printed

        # 3. the CLI: the same job from the job file, its adapter, its locked recipe
        for line in shell_lines(blocks[2][1]):
            if line.startswith("export "):
                for name, value in re.findall(r"(\w+)=(\S+)", reader.filled(line)):
                    reader.env[name] = value
                continue
            done = reader.run(line)
            if "jobs create" in line:
                reader.values["ftjob-..."] = re.search(r"ftjob-\w+", done.stdout + done.stderr).group(0)
        assert (reader.cwd / "adapter.tar.gz").stat().st_size > 1000
        assert "model: tiny" in (reader.cwd / "rerun.yaml").read_text()

        # 4. the fine-tuned model answers what examples/train.jsonl taught it
        # and most of examples/heldout.jsonl, the same facts in wordings never trained with them
        exec(compile(reader.filled(blocks[3][1]), "README.md (python)", "exec"), namespace)  # noqa: S102
        answer, held_out = capsys.readouterr().out.strip().splitlines()
        assert answer == "KR-104"
        right = int(held_out.split(" of ")[0])
        assert held_out == f"{right} of 16 held-out questions" and right >= 12, held_out
        trained = {line for line in (reader.cwd / "examples" / "train.jsonl").read_text().splitlines()}
        assert not trained & set((reader.cwd / "examples" / "heldout.jsonl").read_text().splitlines())

        # 5. promotion: an answer in the API's terms, as far as the gates allow
        reader.values["ft:tiny:acme:..."] = job.fine_tuned_model
        done = reader.run("\n".join(shell_lines(blocks[4][1])))
        assert '"stage":"staging"' in done.stdout.replace(" ", "") or '"code":"gates_failed"' in \
            done.stdout.replace(" ", ""), done.stdout
    finally:
        reader.stop()
