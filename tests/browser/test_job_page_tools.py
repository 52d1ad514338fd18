"""The job page as a user reads a long run: charts first, each saying the values under the
pointer and smoothed on request; the events a page at a time, filtered, with the per-step
metrics reports summarised; and status sentences that read as English and stay on their page."""

from __future__ import annotations

import pytest

from tests.browser.steps import all_events, client, load_every_event, nav, sign_in, upload_rows, wait_for_job
from tuneforge.db.repos import events as event_repo
from tuneforge.db.tables import Job
from tuneforge.demo.dataset import chat_example, demo_facts

pytestmark = [pytest.mark.browser, pytest.mark.sqlite_pass_only]

# a zigzag loss: smoothing visibly flattens it
INJECTED_LOSS = {step: (3.5 if step % 2 else 1.25) for step in range(3, 23)}
INJECTED_LOSS[7] = 2.125


def _small_job(api) -> str:  # noqa: ANN001 - an httpx client
    training = upload_rows(api, [chat_example(fact) for fact in demo_facts(16)], "codes.jsonl")
    created = api.post("/v1/fine_tuning/jobs", json={
        "model": "tiny-chat", "training_file": training["id"], "seed": 0,
        "method": {"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 1, "batch_size": 8}}}})
    assert created.status_code == 200, created.text
    return created.json()["id"]


def _finished_job_with(plane, api, events: list[tuple[str, str, str, dict]]) -> str:  # noqa: ANN001
    """A small finished job, then `events` (message, level, type, data) added after its own."""
    job_id = _small_job(api)
    assert wait_for_job(api, job_id)["precise_status"] == "succeeded"
    with plane.plane.platform.db.session() as session:
        job = session.query(Job).filter_by(job_id=job_id).one()
        for message, level, event_type, data in events:
            event_repo.add(session, job, message, level=level, event_type=event_type, attempt=1, data=data)
    return job_id


def _metrics(step: int, loss: float) -> tuple[str, str, str, dict]:
    return (f"Step {step}/22: training loss={loss}", "info", "metrics",
            {"step": step, "total_steps": 22, "train_loss": loss, "learning_rate": 1e-4})


def _ys(points: str) -> list[float]:
    return [float(pair.split(",")[1]) for pair in points.split()]


def test_charts_come_first_say_the_value_under_the_pointer_and_smooth(plane, page, shots):
    api = client(plane.url, plane.key_a)
    job_id = _finished_job_with(plane, api, [_metrics(step, loss) for step, loss in INJECTED_LOSS.items()])
    sign_in(page, plane.url, plane.key_a)
    page.goto(f"{plane.url}/console#/jobs/{job_id}")
    page.locator('[data-testid="stream-state"][data-finished="true"]').wait_for()

    # the charts sit above the hyperparameter table
    charts_box = page.get_by_test_id("charts").bounding_box()
    table_box = page.get_by_test_id("hyperparameters").bounding_box()
    assert charts_box["y"] + charts_box["height"] <= table_box["y"], (charts_box, table_box)

    # hovering the 7th step's vertex of the loss line says its step and value
    loss = page.locator('[data-chart="loss"]')
    raw = loss.locator('polyline[data-series="train_loss"]')
    vertices = (raw.get_attribute("points") or "").split()
    steps = [event["data"]["step"] for event in reversed(all_events(api, job_id))
             if event["type"] == "metrics" and isinstance(event["data"].get("train_loss"), (int, float))]
    assert len(vertices) == len(steps)
    index = steps.index(7)
    view_x, view_y = (float(value) for value in vertices[index].split(","))
    box = loss.locator("svg").bounding_box()
    page.mouse.move(box["x"] + view_x / 480 * box["width"], box["y"] + view_y / 200 * box["height"])
    readout = loss.get_by_test_id("chart-readout")
    page.wait_for_function("() => document.querySelector('[data-chart=loss] [data-testid=chart-readout]')"
                           ".dataset.step === '7'")
    assert readout.locator("strong").inner_text() == "Step 7"
    assert readout.locator('[data-readout-series="train_loss"]').inner_text() == "Train loss 2.125"
    guide = loss.locator(".hover-guide")
    # (a vertical line has no width: Playwright calls it invisible whatever its style)
    assert "hidden" not in guide.get_attribute("class") and abs(float(guide.get_attribute("x1")) - view_x) < 0.2
    shots(page, "hovered step 7")
    page.mouse.move(1, 1)
    page.wait_for_function("() => !document.querySelector('[data-chart=loss] [data-testid=chart-readout]')"
                           ".dataset.step")
    assert "hidden" in guide.get_attribute("class")

    # every chart on the page has a readout, and the keyboard moves it too
    figures = page.locator('[data-testid="charts"] figure.chart')
    assert figures.count() == page.locator('[data-testid="charts"] [data-testid="chart-readout"]').count() >= 4
    lr_chart = page.locator('[data-chart="learning_rate"] svg')
    lr_chart.focus()
    page.keyboard.press("End")
    assert page.locator('[data-chart="learning_rate"] [data-testid="chart-readout"]').get_attribute("data-step") == "22"

    # smoothing: a second, flatter line per series; the raw line stays, faint
    smooth = loss.locator('polyline[data-smoothed-series="train_loss"]')
    assert (smooth.get_attribute("points") or "") == ""
    raw_points = raw.get_attribute("points")
    page.get_by_label("Smoothing", exact=True).fill("0.9")
    page.get_by_test_id("chart-smoothing-value").filter(has_text="0.90").wait_for()
    smoothed_points = smooth.get_attribute("points")
    assert raw.get_attribute("points") == raw_points  # the raw values are unchanged
    assert len(smoothed_points.split()) == len(vertices)
    assert smoothed_points != raw_points
    raw_y, smooth_y = _ys(raw_points), _ys(smoothed_points)
    assert max(smooth_y[-10:]) - min(smooth_y[-10:]) < (max(raw_y[-10:]) - min(raw_y[-10:])) / 3
    assert float(raw.evaluate("(el) => getComputedStyle(el).opacity")) < 0.5
    # every chart is smoothed, and the readout gives both figures
    assert page.locator('[data-testid="charts"] svg.smoothing').count() == figures.count()
    page.mouse.move(box["x"] + view_x / 480 * box["width"], box["y"] + box["height"] / 2)
    readout.filter(has_text="smoothed").wait_for()
    assert readout.locator('[data-readout-series="train_loss"]').inner_text().startswith("Train loss 2.125 (smoothed ")
    shots(page, "smoothed")
    page.get_by_label("Smoothing", exact=True).fill("0")
    page.get_by_test_id("chart-smoothing-value").filter(has_text="0 (raw)").wait_for()
    assert (smooth.get_attribute("points") or "") == ""
    assert float(raw.evaluate("(el) => getComputedStyle(el).opacity")) == 1


def test_events_are_paged_filtered_and_metrics_summarised(plane, page, shots):
    api = client(plane.url, plane.key_a)
    added = []
    for step in range(3, 103):
        added.append(_metrics(step, 1.0 + 1 / step))
        if step % 10 == 0:
            added.append((f"Checkpoint note at step {step}", "warn" if step % 20 == 0 else "info", "message", {}))
    added.append(("The disk is nearly full", "error", "message", {}))
    job_id = _finished_job_with(plane, api, added)
    everything = all_events(api, job_id)  # newest first
    first_page = [event["id"] for event in everything[:50]]

    sign_in(page, plane.url, plane.key_a)
    page.goto(f"{plane.url}/console#/jobs/{job_id}")
    page.locator('[data-testid="stream-state"][data-finished="true"]').wait_for()
    events = page.get_by_test_id("event-list")
    shown = events.locator("li[data-event-id]")
    summaries = events.get_by_test_id("metrics-summary")

    # the newest 50, with the metrics reports folded into one line per run
    assert events.locator('li[data-type="metrics"]').count() == 0
    first_metrics = [event for event in everything[:50] if event["type"] == "metrics"]
    assert sum(int(count) for count in summaries.evaluate_all("(els) => els.map((el) => el.dataset.count)")) \
        == len(first_metrics)
    assert shown.count() == 50 - len(first_metrics)
    # the newest run: the metrics between the error (newest) and the step-100 note
    assert summaries.first.inner_text() == "Steps 101–102: 2 metrics reports (see the charts)"
    assert shown.first.get_attribute("data-level") == "error"
    shots(page, "events summarised")

    # each report on request, in the API's order
    page.get_by_label("Show each metrics report", exact=True).check()
    assert summaries.count() == 0
    assert shown.evaluate_all("(els) => els.map((el) => el.dataset.eventId)") == first_page

    # older events, a page at a time, until there are none
    older = page.get_by_test_id("events-older")
    older.click()
    page.wait_for_function("() => document.querySelectorAll('[data-testid=event-list] li[data-event-id]')"
                           ".length === 100")
    assert shown.evaluate_all("(els) => els.map((el) => el.dataset.eventId)") == [e["id"] for e in everything[:100]]
    assert load_every_event(page) == len(everything)
    assert shown.evaluate_all("(els) => els.map((el) => el.dataset.eventId)") == [e["id"] for e in everything]

    # filters: a level, a type, words of the message
    page.get_by_label("Level", exact=True).select_option("warn")
    warned = [event["id"] for event in everything if event["level"] == "warn"]
    assert len(warned) >= 5
    assert shown.evaluate_all("(els) => els.map((el) => el.dataset.eventId)") == warned
    page.get_by_label("Level", exact=True).select_option("")
    page.get_by_label("Type", exact=True).select_option("metrics")
    assert shown.count() == sum(1 for event in everything if event["type"] == "metrics")
    assert set(shown.evaluate_all("(els) => els.map((el) => el.dataset.type)")) == {"metrics"}
    page.get_by_label("Type", exact=True).select_option("")
    page.get_by_label("Message contains", exact=True).fill("DISK")
    assert shown.all_inner_texts() and len(shown.all_inner_texts()) == 1
    assert "The disk is nearly full" in shown.first.inner_text()
    assert "Showing 1 of" in page.get_by_test_id("event-count").inner_text()
    shots(page, "events filtered")


def test_a_job_status_sentence_reads_as_english(plane, page, shots):
    api = client(plane.url, plane.key_a)
    sign_in(page, plane.url, plane.key_a)
    job_id = _small_job(api)
    page.goto(f"{plane.url}/console#/jobs/{job_id}")
    # the job finishes while its page is open: the sentence says so as English does
    page.locator("#status").filter(has_text=f"Job {job_id} succeeded.").wait_for(timeout=120_000)
    assert " is succeeded" not in page.locator("#status").inner_text()
    shots(page, "job succeeded")


def test_a_pages_status_line_does_not_follow_to_the_next_page(plane, page, shots):
    api = client(plane.url, plane.key_a)
    training = upload_rows(api, [chat_example(fact) for fact in demo_facts(6)], "codes.jsonl")
    sign_in(page, plane.url, plane.key_a)
    # a message of the dataset page (the page shows examples as it opens) ...
    page.goto(f"{plane.url}/console#/files/{training['id']}")
    page.locator("#status").filter(has_text="Showing 3 examples with").wait_for()
    # ... is not the Models page's, even when its answer arrives after the user has moved on
    held = []
    page.route("**/preview*", lambda route: held.append(route))
    page.get_by_role("button", name="Show examples").click()
    page.wait_for_timeout(100)
    assert len(held) == 1
    nav(page, "Models").click()
    page.get_by_role("heading", name="Models", exact=True).wait_for()
    with page.expect_response(lambda answer: "/preview" in answer.url):
        held[0].continue_()
    page.wait_for_timeout(200)  # past the status line's announcement delay
    assert page.locator("#status").inner_text() == ""
    shots(page, "models page, no stale status")
