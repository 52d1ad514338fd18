"""The job page charts a training method's own figures: a number in a metrics event that is none
of the trainer's own gets a chart named after it, with a point for each event that carries it."""

from __future__ import annotations

import pytest

from tests.browser.steps import client, plotted_points, sign_in, upload_rows, wait_for_job
from tuneforge.db.repos import events as event_repo
from tuneforge.db.tables import Job
from tuneforge.demo.dataset import chat_example, demo_facts

pytestmark = [pytest.mark.browser, pytest.mark.sqlite_pass_only]


def _finished_job(plane) -> str:  # noqa: ANN001
    """A one-epoch job of the demo's codes, succeeded; its id."""
    api = client(plane.url, plane.key_a)
    training = upload_rows(api, [chat_example(fact) for fact in demo_facts(16)], "codes.jsonl")
    created = api.post("/v1/fine_tuning/jobs", json={
        "model": "tiny-chat", "training_file": training["id"], "seed": 0,
        "method": {"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 1, "batch_size": 8}}}})
    assert created.status_code == 200, created.text
    job_id = created.json()["id"]
    assert wait_for_job(api, job_id)["precise_status"] == "succeeded"
    return job_id


def test_a_methods_own_figures_get_a_chart_each(plane, page, shots):
    job_id = _finished_job(plane)
    # what a generating method's trainer reports beside the loop's figures (tests/unit/train/test_rollout.py)
    with plane.plane.platform.db.session() as session:
        job = session.query(Job).filter_by(job_id=job_id).one()
        for step, reward in ((1, 0.25), (2, 0.5)):
            validation = {"valid_reward_mean": reward + 0.1} if step == 2 else {}  # (validating steps only)
            event_repo.add(session, job, f"Step {step}/2", event_type="metrics", attempt=1,
                           data={"step": step, "total_steps": 2, "mfu": 0.1,
                                 "reward_mean": reward, "rollout_mean_length": 3.0 + step, **validation})

    sign_in(page, plane.url, plane.key_a)
    page.goto(f"{plane.url}/console#/jobs/{job_id}")
    page.locator('[data-testid="stream-state"][data-finished="true"]').wait_for()
    for key, title in (("reward_mean", "Reward mean"), ("rollout_mean_length", "Rollout mean length")):
        chart = page.locator(f'[data-testid="charts"] [data-chart="{key}"]')
        assert chart.locator("figcaption").inner_text() == title
        assert plotted_points(page, key, key) == 2
    # a `valid_` figure is the validation line of its figure's chart, added when it first appears
    assert plotted_points(page, "reward_mean", "valid_reward_mean") == 1
    legend = page.locator('[data-chart="reward_mean"] .legend li').all_inner_texts()
    assert legend == ["Reward mean", "Validation reward mean"]
    # the trainer's own figures keep their charts, and those it shows nowhere get none
    assert page.locator('[data-testid="charts"] figure').count() == 4 + 2
    assert page.locator('[data-chart="mfu"]').count() == 0
    shots(page, "own figures charted")


def test_what_nvml_said_of_the_gpu_gets_its_charts_and_a_cpu_job_none(plane, page, shots):
    job_id = _finished_job(plane)
    sign_in(page, plane.url, plane.key_a)
    page.goto(f"{plane.url}/console#/jobs/{job_id}")
    page.locator('[data-testid="stream-state"][data-finished="true"]').wait_for()
    assert page.locator('[data-chart^="gpu_"]').count() == 0  # trained on a CPU: no GPU chart

    # what a GPU trainer's metrics carry (train/gpu_telemetry.py), as a second attempt's steps
    with plane.plane.platform.db.session() as session:
        job = session.query(Job).filter_by(job_id=job_id).one()
        for step, (busy, used) in enumerate(((0.9, 30000.0), (0.6, 42000.0), (0.8, 36000.0)), start=100):
            event_repo.add(session, job, f"Step {step}/102", event_type="metrics", attempt=2,
                           data={"step": step, "total_steps": 102, "gpu_utilization": busy,
                                 "gpu_memory_used_mb": used, "gpu_memory_peak_mb": 42000.0 if step > 100 else used,
                                 "gpu_power_w": 500.0, "gpu_temperature_c": 65.0})
    page.reload()
    page.locator('[data-testid="stream-state"][data-finished="true"]').wait_for()
    for name, title in (("gpu_utilization", "GPU utilisation"), ("gpu_memory", "GPU memory (MiB)"),
                        ("gpu_power", "GPU power (W)"), ("gpu_temperature", "GPU temperature (°C)")):
        assert page.locator(f'[data-chart="{name}"] figcaption').inner_text() == title
    assert plotted_points(page, "gpu_utilization", "gpu_utilization") == 3
    assert plotted_points(page, "gpu_memory", "gpu_memory_used_mb") == 3
    assert plotted_points(page, "gpu_memory", "gpu_memory_peak_mb") == 3
    assert page.locator('[data-chart="gpu_memory"] .legend li').all_inner_texts() == ["Used", "Peak"]
    # no chart named after a GPU figure itself: they live in the GPU charts
    assert page.locator('[data-chart="gpu_memory_used_mb"]').count() == 0
    shots(page, "gpu charts")
