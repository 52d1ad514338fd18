"""A job from start to finish through the console: sign in, upload the training file with
its progress bar, fill the form, see the estimate before creating the job, watch the charts
gain the points the job reports while it trains, read the eval results, download a
checkpoint, promote the model, compare it with its base in the playground, and find the job
in the list and the month's usage."""

from __future__ import annotations

import gzip
import re

import pytest

from tests.browser.steps import (
    OBSERVE_CHART_POINTS,
    all_events,
    assert_fits,
    client,
    load_every_event,
    metric_points,
    nav,
    plotted_points,
    point_history,
    sign_in,
    upload_rows,
)
from tuneforge.demo.dataset import DEMO_HYPERPARAMETERS, chat_example, demo_facts, write_jsonl

pytestmark = [pytest.mark.browser, pytest.mark.sqlite_pass_only]

N_EPOCHS = 20  # 24 examples, batches of 8: 60 steps, a few seconds on the tiny model
CHART_SERIES = [("loss", "train_loss"), ("loss", "valid_loss"), ("learning_rate", "learning_rate"),
                ("grad_norm", "grad_norm"), ("tokens_per_second", "tokens_per_second")]


def test_a_job_from_upload_to_promotion(plane, page, shots, tmp_path):
    api = client(plane.url, plane.key_a)
    facts = demo_facts(24)
    training_path = write_jsonl(tmp_path / "codes.jsonl", [chat_example(fact) for fact in facts])
    validation = upload_rows(api, [chat_example(fact) for fact in facts[:6]], "codes-valid.jsonl")

    sign_in(page, plane.url, plane.key_a)
    nav(page, "New job").click()
    page.get_by_role("heading", name="New fine-tuning job").wait_for()

    # the training file, uploaded with a progress bar; it becomes the form's training file
    page.get_by_label("Training data file", exact=True).set_input_files(str(training_path))
    page.get_by_role("button", name="Upload").click()
    uploaded = page.get_by_test_id("uploaded-file")
    uploaded.wait_for()
    training_id = uploaded.inner_text()
    assert page.get_by_test_id("upload-progress").evaluate("(el) => el.value === el.max && el.max > 0")
    assert page.get_by_label("Training file", exact=True).input_value() == training_id
    assert api.get(f"/v1/files/{training_id}").json()["status"] == "processed"
    shots(page, "uploaded")

    page.get_by_label("Validation file", exact=True).select_option(validation["id"])
    assert page.get_by_label("Base model", exact=True).input_value() == "tiny-chat"
    assert page.get_by_label("Method", exact=True).input_value() == "supervised"
    page.get_by_label("n_epochs", exact=True).fill(str(N_EPOCHS))
    page.get_by_label("batch_size", exact=True).fill("8")
    page.get_by_label("learning_rate", exact=True).fill(str(DEMO_HYPERPARAMETERS["learning_rate"]))
    # the eval: the task file's own questions, one gate that a trained model meets
    page.get_by_label("Eval after training", exact=True).select_option("custom")
    page.get_by_label("Task file", exact=True).select_option(training_id)
    page.get_by_label("Run the golden (general-ability) set", exact=True).uncheck()
    page.get_by_label("Run the safety (harmful-prompt) set", exact=True).uncheck()
    page.get_by_label("Max new tokens", exact=True).fill("8")
    page.get_by_label("Max examples", exact=True).fill("4")
    page.get_by_role("button", name="Add a gate").click()
    page.get_by_label("Threshold", exact=True).fill("0")
    page.get_by_label("Suffix", exact=True).fill("browser")
    page.get_by_label("Metadata", exact=True).fill("run=browser")

    # the estimate comes first: "Create job" is off until it is on screen for this very body
    create = page.get_by_role("button", name="Create job")
    assert create.is_disabled()
    page.get_by_role("button", name="Estimate").click()
    figures = page.get_by_test_id("estimate-figures")
    figures.wait_for()
    assert create.is_enabled()
    shown_steps = int(figures.locator("dt:text-is('Steps') + dd").inner_text().replace(",", ""))
    assert shown_steps == N_EPOCHS * 3
    assert "USD" in figures.locator("dt:text-is('Price') + dd").inner_text()
    page.get_by_label("n_epochs", exact=True).fill(str(N_EPOCHS + 1))  # a change makes the estimate stale
    assert create.is_disabled()
    page.get_by_label("n_epochs", exact=True).fill(str(N_EPOCHS))
    assert create.is_enabled()
    shots(page, "estimate before create")

    page.evaluate(OBSERVE_CHART_POINTS)  # before the job page exists: every update is seen
    create.click()
    page.wait_for_url(re.compile(r".*#/jobs/ftjob-[A-Za-z0-9]+$"))
    job_id = page.url.rsplit("/", 1)[-1]
    page.get_by_role("heading", name=f"Job {job_id}").wait_for()
    job = api.get(f"/v1/fine_tuning/jobs/{job_id}").json()
    assert job["estimate"]["steps"] == shown_steps
    assert job["metadata"] == {"run": "browser"} and job["validation_file"] == validation["id"]
    assert job["eval"]["gates"][0]["threshold"] == 0 and job["eval"]["golden"] is False
    shots(page, "job page while queued")

    page.locator('[data-testid="stream-state"][data-finished="true"]').wait_for(timeout=300_000)
    job = api.get(f"/v1/fine_tuning/jobs/{job_id}").json()
    assert job["status"] == "succeeded", job["error"]
    page.get_by_test_id("job-status").filter(has_text="succeeded").wait_for()
    shots(page, "job finished")

    # every chart plots exactly the points the job's metric events report
    events = all_events(api, job_id)
    for chart, series in CHART_SERIES:
        assert plotted_points(page, chart, series) == metric_points(events, series), series
    steps = metric_points(events, "train_loss")
    assert steps == N_EPOCHS * 3
    assert 0 < metric_points(events, "valid_loss") < steps  # measured at checkpoints only
    # and the loss chart grew while the job ran, point by point as the events arrived
    history = point_history(page, "train_loss")
    assert history[-1] == steps
    assert history == sorted(set(history)), history
    assert len([count for count in history if 0 < count < steps]) >= 1, history
    assert page.get_by_test_id("job-progress").inner_text() == f"Step {steps} of {steps}"
    # every event, metrics reports included, once the older pages are loaded
    page.get_by_label("Show each metrics report", exact=True).check()
    assert load_every_event(page) == len(events)
    assert page.locator('[data-testid="event-list"] li[data-event-id]').count() == len(events)

    # eval results: the figures, the gate and its verdict
    verdict = page.get_by_test_id("eval-verdict")
    verdict.filter(has_text="All 1 gate passed").wait_for()
    gate = page.locator('[data-testid="eval-gates"] tbody tr')
    assert gate.count() == 1 and gate.get_attribute("data-passed") == "true"
    assert "✓ Passed" in gate.inner_text()
    assert job["eval_results"]["gates"]["gates"][0]["reason"] in gate.inner_text()
    assert page.locator('[data-testid="eval-figures"] tr[data-metric="task.exact_match"]').count() == 1

    # checkpoints, each downloadable with the bearer key (fetched as a blob)
    checkpoints = api.get(f"/v1/fine_tuning/jobs/{job_id}/checkpoints", params={"limit": 100}).json()["data"]
    buttons = page.locator('[data-testid="checkpoints"] button[data-step]')
    assert buttons.count() == len(checkpoints) > 0
    newest = checkpoints[0]["step_number"]
    with page.expect_download() as caught:
        page.locator(f'[data-testid="checkpoints"] button[data-step="{newest}"]').click()
    saved = tmp_path / "checkpoint.tar.gz"
    caught.value.save_as(saved)
    assert gzip.decompress(saved.read_bytes())  # a real gzip archive
    assert page.locator('[data-testid="attempts"] tbody tr').count() == 1
    assert_fits(page)
    shots(page, "charts eval checkpoints")

    # the registry: promote the model, see the move in its history
    model_id = job["fine_tuned_model"]
    page.locator('[data-testid="job-overview"]').get_by_role("link", name=model_id).click()
    page.get_by_test_id("model-stage").filter(has_text="dev").wait_for()
    assert page.get_by_test_id("lineage").locator("dt:text-is('Job') + dd").inner_text() == job_id
    page.get_by_label("Stage", exact=True).select_option("staging")
    page.get_by_role("button", name="Move to stage").click()
    page.get_by_test_id("model-stage").filter(has_text="staging").wait_for()
    history_rows = page.locator('[data-testid="stage-table"] tbody tr')
    history_rows.first.wait_for()
    assert history_rows.count() == 1
    assert history_rows.first.locator("td").nth(1).inner_text() == "dev"
    assert history_rows.first.locator("td").nth(2).inner_text() == "staging"
    assert api.get(f"/v1/models/{model_id}").json()["stage"] == "staging"
    assert_fits(page)
    shots(page, "promoted")

    # the playground: the same prompt to the base and the fine-tuned model
    page.get_by_role("link", name="Compare it with its base model in the playground").click()
    page.get_by_label("Prompt", exact=True).fill("What is the code for " + facts[0].key + "?")
    page.get_by_label("Max tokens", exact=True).fill("8")
    page.get_by_role("button", name="Ask both").click()
    page.get_by_text("Both answers are in.").wait_for()
    for side in ("answer-base", "answer-tuned"):
        meta = page.get_by_test_id(side).locator("xpath=following-sibling::p")
        assert re.match(r"finish: \w+; \d+ tokens", meta.inner_text()), meta.inner_text()
    shots(page, "playground")

    # the jobs list, filtered by metadata and status
    nav(page, "Jobs").click()
    page.get_by_role("heading", name="Fine-tuning jobs").wait_for()
    page.get_by_label("Metadata", exact=True).fill("run=browser")
    page.get_by_role("button", name="Apply filters").click()
    page.locator(f'[data-testid="jobs-table"] tr[data-job="{job_id}"]').wait_for()
    page.get_by_label("Metadata", exact=True).fill("run=other")
    page.get_by_role("button", name="Apply filters").click()
    page.get_by_test_id("jobs-summary").filter(has_text="0 jobs shown").wait_for()
    page.get_by_label("Metadata", exact=True).fill("")
    page.get_by_role("button", name="Apply filters").click()
    page.get_by_label("Status", exact=True).select_option("running")
    page.get_by_test_id("jobs-summary").filter(has_text="0 jobs shown of 1").wait_for()
    page.get_by_label("Status", exact=True).select_option("succeeded")
    page.get_by_test_id("jobs-summary").filter(has_text="1 job shown of 1").wait_for()
    shots(page, "jobs list")

    # the month's usage shows the job's metered GPU time
    nav(page, "Usage").click()
    page.get_by_test_id("usage-jobs").get_by_role("link", name=job_id).wait_for()
    shots(page, "usage")
