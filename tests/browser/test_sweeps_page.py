"""The sweeps pages: a sweep's trials appear as the scheduler starts them (parameters, status),
and cancelling it from the page cancels its running trials, as the API then says."""

from __future__ import annotations

import pytest

from tests.browser.steps import assert_fits, client, sign_in, upload_rows
from tuneforge.demo.dataset import chat_example, demo_facts

pytestmark = [pytest.mark.browser, pytest.mark.sqlite_pass_only]


def test_a_sweep_page_shows_its_trials_and_cancels_them(plane, page, shots):
    api = client(plane.url, plane.key_a)
    rows = [chat_example(fact) for fact in demo_facts(24)]
    training = upload_rows(api, rows[:20], "train.jsonl")
    validation = upload_rows(api, rows[20:], "valid.jsonl")
    created = api.post("/v1/fine_tuning/sweeps", json={
        "job": {"model": "tiny-chat", "training_file": training["id"], "validation_file": validation["id"],
                "method": {"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 50,
                                                                                    "batch_size": 1}}}},
        "search_space": {"learning_rate": {"type": "choice", "values": [0.001, 0.01, 0.1]}},
        "max_parallel": 1, "early_stopping": {"type": "asha", "min_epochs": 1, "eta": 3}})
    assert created.status_code == 200, created.text
    sweep_id = created.json()["id"]

    sign_in(page, plane.url, plane.key_a)
    page.goto(f"{plane.url}/console#/sweeps")
    page.get_by_role("heading", name="Sweeps", exact=True).wait_for()
    page.get_by_test_id("sweeps-table").get_by_role("link", name=sweep_id).click()
    page.get_by_role("heading", name=f"Sweep {sweep_id}").wait_for()
    # the scheduler starts the first trial (one at a time); the page picks it up on its own
    first = page.get_by_test_id("trials-table").locator("tbody tr").first
    first.wait_for(timeout=60_000)
    # the grid's first, as its seed shuffled it
    [trial] = api.get(f"/v1/fine_tuning/sweeps/{sweep_id}").json()["trials"]
    assert trial["params"]["learning_rate"] in (0.001, 0.01, 0.1)
    assert first.locator("td").nth(1).inner_text() == f"learning_rate={trial['params']['learning_rate']:g}"
    assert page.get_by_test_id("sweep-status").inner_text() == "running"
    assert page.get_by_role("button", name="Promote the best to staging").is_disabled()
    assert_fits(page)
    shots(page, "sweep running")

    page.get_by_role("button", name="Cancel sweep").click()
    page.locator("#status").filter(has_text=f"Sweep {sweep_id} was cancelled.").wait_for()
    assert page.get_by_test_id("sweep-status").inner_text() == "cancelled"
    shown = api.get(f"/v1/fine_tuning/sweeps/{sweep_id}").json()
    assert shown["status"] == "cancelled"
    for trial in shown["trials"]:
        assert api.get(f"/v1/fine_tuning/jobs/{trial['job_id']}").json()["status"] == "cancelled"
    assert page.get_by_role("button", name="Cancel sweep").is_disabled()
    shots(page, "sweep cancelled")
