"""Screenshots of every console page for docs/console.md, taken against a live control plane
with a demo job (the tiny model trained on the demo facts, with a validation file).

Runs only when TUNEFORGE_CONSOLE_SCREENSHOTS names the folder to write (scripts/console-screenshots.sh
writes docs/images/console/); each page is one 1200×800 PNG of the window, kept small."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.browser.conftest import ADMIN_KEY
from tests.browser.steps import client, sign_in, upload_rows, wait_for_job
from tuneforge.demo.dataset import DEMO_HYPERPARAMETERS, chat_example, demo_facts

pytestmark = [pytest.mark.browser, pytest.mark.sqlite_pass_only]

TARGET = os.environ.get("TUNEFORGE_CONSOLE_SCREENSHOTS")
WINDOW = {"width": 1200, "height": 800}
MAX_BYTES = 150_000


def _demo_job(api) -> dict:  # noqa: ANN001 - an httpx client
    facts = demo_facts(24)
    training = upload_rows(api, [chat_example(fact) for fact in facts], "codes.jsonl")
    validation = upload_rows(api, [chat_example(fact) for fact in facts[:6]], "codes-valid.jsonl")
    created = api.post("/v1/fine_tuning/jobs", json={
        "model": "tiny-chat", "training_file": training["id"], "validation_file": validation["id"],
        "seed": 0, "suffix": "codes", "metadata": {"team": "support"},
        "method": {"type": "supervised", "supervised": {"hyperparameters": {
            **DEMO_HYPERPARAMETERS, "n_epochs": 20, "batch_size": 8}}}})
    assert created.status_code == 200, created.text
    job = wait_for_job(api, created.json()["id"])
    assert job["precise_status"] == "succeeded", job["error"]
    return job


@pytest.mark.skipif(not TARGET, reason="set TUNEFORGE_CONSOLE_SCREENSHOTS to the folder the screenshots go to")
def test_a_screenshot_of_every_page(plane, browser):  # noqa: ANN001
    folder = Path(TARGET)
    folder.mkdir(parents=True, exist_ok=True)
    api = client(plane.url, plane.key_a)
    job = _demo_job(api)
    context = browser.new_context(viewport=WINDOW, device_scale_factor=1)
    page = context.new_page()
    taken = []

    def shot(name: str, fragment: str | None, ready: str) -> None:
        if fragment is not None:
            page.goto(f"{plane.url}/console#{fragment}")
        page.locator(ready).first.wait_for()
        page.wait_for_timeout(150)  # past the status line's announcement
        path = folder / f"{name}.png"
        page.screenshot(path=str(path))
        assert page.locator("#error").is_hidden(), page.locator("#error").inner_text()
        taken.append(path)

    try:
        sign_in(page, plane.url, plane.key_a)
        shot("jobs", "/jobs", "table.grid tbody tr")
        page.goto(f"{plane.url}/console#/jobs/{job['id']}")
        page.locator('[data-testid="stream-state"][data-finished="true"]').wait_for()
        page.get_by_label("Smoothing", exact=True).fill("0.6")
        loss = page.locator('[data-chart="loss"] svg').bounding_box()
        page.mouse.move(loss["x"] + loss["width"] * 0.55, loss["y"] + loss["height"] * 0.5)
        shot("job", None, '[data-chart="loss"][data-hovering]')
        page.get_by_test_id("event-list").scroll_into_view_if_needed()
        shot("job-events", None, '[data-testid="metrics-summary"]')
        shot("new-job", "/jobs/new", "#create-title")
        shot("files", "/files", "table.grid tbody tr")
        page.goto(f"{plane.url}/console#/files/{job['training_file']}")
        page.get_by_role("button", name="Show examples").click()
        shot("dataset", None, '[data-testid="preview"] figure.example')
        shot("models", "/models", "table.grid tbody tr")
        shot("model", f"/models/{job['fine_tuned_model']}", "main h1")
        shot("sweeps", "/sweeps", "main h1")
        shot("routes", "/routes", "main h1")
        shot("usage", "/usage", "table.grid")
        shot("playground", "/playground", "main h1")
        page.get_by_role("button", name="Sign out").click()
        sign_in(page, plane.url, ADMIN_KEY)
        shot("admin-tenants", "/admin/tenants", "table.grid tbody tr")
        shot("admin-queue", "/admin/queue", "main h1")
        shot("admin-usage", "/admin/usage", "main h1")
    finally:
        context.close()
    too_big = {path.name: path.stat().st_size for path in taken if path.stat().st_size > MAX_BYTES}
    assert not too_big, f"screenshots over {MAX_BYTES} bytes: {too_big}"
