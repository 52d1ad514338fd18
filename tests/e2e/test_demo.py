"""`tuneforge demo` leaves you somewhere: on the platform's home, with the console's URL, an API key
and commands to paste; `tuneforge up` on that home then serves its tenant, job and model."""

from __future__ import annotations

import re

import httpx

from tests.helpers.net import free_port
from tuneforge.demo.dataset import DEMO_HYPERPARAMETERS
from tuneforge.demo.run import run_demo
from tuneforge.server import ControlPlane
from tuneforge.settings import Settings


def test_the_demo_runs_on_the_home_up_opens_and_prints_where_to_go_next(tmp_path, capsys, monkeypatch) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("TUNEFORGE_HOME", str(home))
    monkeypatch.setenv("TUNEFORGE_EVAL_BY_DEFAULT", "false")  # (the post-training eval is tested elsewhere)
    port = free_port()
    quick = {**DEMO_HYPERPARAMETERS, "n_epochs": 2}  # (the demo's own 50 epochs are what makes it learn)
    assert run_demo(port=port, hyperparameters=quick) == 0
    said = capsys.readouterr().out
    url = f"http://127.0.0.1:{port}"
    assert f"console:  {url}/console" in said and f"export TUNEFORGE_BASE_URL={url}/v1" in said
    key = re.search(r"API key:\s+(tf-\S+)", said).group(1)
    job_id = re.search(r"tuneforge jobs get (ftjob-\S+)", said).group(1)
    assert f"tuneforge up --port {port}" in said and "client.chat.completions.create(model=\"ft:" in said

    # `tuneforge up` on the same home (no TUNEFORGE_HOME needed beyond the one the demo used)
    with ControlPlane(Settings(port=free_port())) as plane:
        jobs = httpx.get(f"{plane.url}/v1/fine_tuning/jobs", headers={"Authorization": f"Bearer {key}"}).json()
        assert [(job["id"], job["status"]) for job in jobs["data"]] == [(job_id, "succeeded")]
        assert httpx.get(f"{plane.url}/console").status_code == 200

    # a second demo on the same home reuses the tenant (a new key) and the base model (same digest)
    from tuneforge.demo.run import _base_model, _tenant_key

    with ControlPlane(Settings(port=free_port())) as plane:
        with plane.platform.db.session() as session:
            second_key = _tenant_key(session, "demo")
            model_dir = _base_model(session, plane, home / "demo")
        assert second_key != key and model_dir == home / "demo" / "models" / "tiny-chat"
        listed = httpx.get(f"{plane.url}/v1/fine_tuning/jobs", headers={"Authorization": f"Bearer {second_key}"})
        assert [job["id"] for job in listed.json()["data"]] == [job_id]
