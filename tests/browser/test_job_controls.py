"""The job page's controls and verdicts: pause, resume and cancel; a failed gate with its
reason and suggestions, and the API's refusal to promote such a model shown as it said it."""

from __future__ import annotations

import json

import pytest

from tests.browser.steps import assert_fits, client, sign_in, upload_rows, wait_for_job
from tuneforge.demo.dataset import chat_example, demo_facts

pytestmark = [pytest.mark.browser, pytest.mark.sqlite_pass_only]


def _create(api, training_id: str, hyperparameters: dict, **extra) -> dict:  # noqa: ANN001
    body = {"model": "tiny-chat", "training_file": training_id, "seed": 0,
            "method": {"type": "supervised", "supervised": {"hyperparameters": hyperparameters}}, **extra}
    answer = api.post("/v1/fine_tuning/jobs", json=body)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_pause_resume_and_cancel_from_the_job_page(plane, page, shots):
    api = client(plane.url, plane.key_a)
    training = upload_rows(api, [chat_example(fact) for fact in demo_facts(24)], "codes.jsonl")
    # long enough that it is still training whatever the page does, and cancelled at the end
    job = _create(api, training["id"], {"n_epochs": 50, "batch_size": 1})
    sign_in(page, plane.url, plane.key_a)
    page.goto(f"{plane.url}/console#/jobs/{job['id']}")
    status = page.get_by_test_id("job-status")
    status.locator(".badge").wait_for()
    pause, resume = page.get_by_role("button", name="Pause"), page.get_by_role("button", name="Resume")
    cancel = page.get_by_role("button", name="Cancel job")
    assert resume.is_disabled() and cancel.is_enabled()

    pause.click()  # a queued job pauses at once, a running one checkpoints first
    status.filter(has_text="paused").wait_for(timeout=120_000)
    assert api.get(f"/v1/fine_tuning/jobs/{job['id']}").json()["precise_status"] == "paused"
    assert pause.is_disabled() and resume.is_enabled()
    page.locator("#status").filter(has_text=f"Job {job['id']} is paused.").wait_for()
    shots(page, "paused")

    resume.click()
    page.wait_for_function("() => !['paused', 'pausing'].includes("
                           "document.querySelector('[data-testid=job-status] .badge').textContent)")
    assert api.get(f"/v1/fine_tuning/jobs/{job['id']}").json()["precise_status"] in ("queued", "running")
    shots(page, "resumed")

    cancel.click()
    page.get_by_role("group", name="Confirm cancelling").wait_for()
    page.get_by_role("button", name="Yes, cancel the job").click()
    status.filter(has_text="cancelled").wait_for()
    assert wait_for_job(api, job["id"])["precise_status"] == "cancelled"
    assert cancel.is_disabled() and pause.is_disabled() and resume.is_disabled()
    page.locator('[data-testid="stream-state"][data-finished="true"]').wait_for()
    shots(page, "cancelled")


def test_a_failed_gate_shows_its_reason_and_suggestions_and_blocks_promotion(plane, page, shots):
    api = client(plane.url, plane.key_a)
    training = upload_rows(api, [chat_example(fact) for fact in demo_facts(24)], "codes.jsonl")
    job = _create(api, training["id"], {"n_epochs": 1, "batch_size": 8}, eval={
        "task_file": training["id"], "metrics": ["exact_match"], "golden": False, "safety": False,
        "max_new_tokens": 4, "max_examples": 2,
        "gates": [{"metric": "task.exact_match", "op": ">", "threshold": 1.0}]})  # no model can pass it
    done = wait_for_job(api, job["id"])
    assert done["precise_status"] == "succeeded", done["error"]
    report = done["eval_results"]["gates"]
    assert report["passed"] is False and report["suggestions"]

    sign_in(page, plane.url, plane.key_a)
    page.goto(f"{plane.url}/console#/jobs/{job['id']}")
    page.get_by_test_id("eval-verdict").filter(has_text="1 of 1 gate failed").wait_for()
    gate = page.locator('[data-testid="eval-gates"] tbody tr')
    assert gate.get_attribute("data-passed") == "false"
    assert "✗ Failed" in gate.inner_text() and report["gates"][0]["reason"] in gate.inner_text()
    shown = page.locator('[data-testid="eval-suggestions"] li').all_inner_texts()
    assert shown == report["suggestions"]
    assert_fits(page)
    shots(page, "failed gate")

    model_id = done["fine_tuned_model"]
    page.goto(f"{plane.url}/console#/models/{model_id}")
    page.get_by_test_id("model-promotable").filter(has_text="no").wait_for()
    refusal = api.post(f"/v1/models/{model_id}/promote", json={"stage": "staging"})
    assert refusal.status_code == 409
    page.get_by_label("Stage", exact=True).select_option("staging")
    page.get_by_role("button", name="Move to stage").click()
    page.get_by_role("alert").filter(has_text=refusal.json()["error"]["message"]).wait_for()
    assert page.get_by_test_id("model-stage").inner_text() == "dev"
    assert page.locator('[data-testid="eval-suggestions"] li').all_inner_texts() == report["suggestions"]
    shots(page, "promotion refused")


def test_a_panel_that_fails_to_load_says_so_and_leaves_the_page_and_its_controls(plane, page, shots):
    api = client(plane.url, plane.key_a)
    training = upload_rows(api, [chat_example(fact) for fact in demo_facts(24)], "codes.jsonl")
    job = _create(api, training["id"], {"n_epochs": 50, "batch_size": 1})
    sign_in(page, plane.url, plane.key_a)
    refused: list[str] = []

    def refuse_once(route) -> None:  # noqa: ANN001 - a Playwright Route
        if refused:
            route.continue_()
            return
        refused.append(route.request.url)
        body = {"error": {"message": "Too many requests: retry in 1 s.", "type": "rate_limit_error",
                          "param": None, "code": "rate_limited"}}
        route.fulfill(status=429, headers={"Retry-After": "1"}, content_type="application/json", body=json.dumps(body))

    page.route("**/checkpoints*", refuse_once)  # a busy server turns one panel's request away
    page.goto(f"{plane.url}/console#/jobs/{job['id']}")
    page.locator("#error").filter(has_text="Too many requests: retry in 1 s.").wait_for()
    assert refused
    # the page is still the job's, with its status and controls, not "Could not load this page"
    assert page.get_by_role("heading", level=1).inner_text() == f"Job {job['id']}"
    page.get_by_test_id("job-status").locator(".badge").wait_for()
    cancel = page.get_by_role("button", name="Cancel job")
    assert cancel.is_enabled()
    shots(page, "a panel refused")
    cancel.click()
    page.get_by_role("button", name="Yes, cancel the job").click()
    page.get_by_test_id("job-status").filter(has_text="cancelled").wait_for()
    assert wait_for_job(api, job["id"])["precise_status"] == "cancelled"
