"""The dataset page: the validation report of a bad file (errors with their line numbers)
and a good file's examples through the base model's chat template, trained tokens marked."""

from __future__ import annotations

import json

import pytest

from tests.browser.steps import assert_fits, client, nav, sign_in, upload_rows
from tests.helpers.files import hold_upload_checks
from tests.helpers.platform import chat_lines
from tuneforge.demo.dataset import chat_example, demo_facts, write_jsonl

pytestmark = [pytest.mark.browser, pytest.mark.sqlite_pass_only]


def test_a_bad_file_shows_its_errors_with_line_numbers(plane, page, shots, tmp_path):
    rows = [chat_example(fact) for fact in demo_facts(6)]
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    with path.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps({"messages": [{"role": "user"}]}) + "\n")  # line 7: no content
        handle.write("not json\n")  # line 8
    sign_in(page, plane.url, plane.key_a)
    nav(page, "Files").click()
    page.get_by_role("heading", name="Files").wait_for()
    # uploaded through the page, with its progress bar
    page.get_by_label("Training data file").set_input_files(str(path))
    page.get_by_role("button", name="Upload").click()
    page.get_by_test_id("upload-note").filter(has_text="did not pass validation").wait_for()
    bar = page.get_by_test_id("upload-progress")
    assert bar.evaluate("(el) => el.value === el.max && el.max > 0")
    shots(page, "uploaded bad file")

    page.get_by_role("link", name="Open the report").click()
    page.get_by_test_id("validation-verdict").wait_for()
    file_id = page.url.rsplit("/", 1)[-1]
    report = client(plane.url, plane.key_a).get(f"/v1/files/{file_id}/validation").json()
    assert report["ok"] is False
    expected = sorted((issue["line"], code) for code, group in report["errors"].items() for issue in group["first"])
    assert expected == [(7, "missing_key"), (8, "invalid_json")]
    shown = page.locator('[data-testid="validation-errors"] tbody tr')
    shown_issues = [(int(row.get_attribute("data-line")), row.get_attribute("data-code")) for row in shown.all()]
    assert sorted(shown_issues) == expected
    assert shown.locator("td:first-child").all_inner_texts() == ["7", "8"]  # in line order
    messages = {issue["message"] for group in report["errors"].values() for issue in group["first"]}
    assert set(shown.locator("td:nth-child(4)").all_inner_texts()) == messages
    assert "did not pass validation" in page.get_by_test_id("validation-verdict").inner_text()
    assert_fits(page)
    shots(page, "validation errors")


def test_the_trained_tokens_are_highlighted_as_the_preview_counts_them(plane, page, shots):
    api = client(plane.url, plane.key_a)
    uploaded = upload_rows(api, [chat_example(fact) for fact in demo_facts(8)], "codes.jsonl")
    sign_in(page, plane.url, plane.key_a)
    page.goto(f"{plane.url}/console#/files/{uploaded['id']}")
    page.get_by_test_id("validation-verdict").filter(has_text="passed validation").wait_for()
    preview = page.get_by_test_id("preview")
    preview.locator("figure.example").first.wait_for()
    shots(page, "token highlighting")

    expected = api.get(f"/v1/files/{uploaded['id']}/preview", params={"model": "tiny-chat", "limit": 3}).json()
    assert len(expected["examples"]) == 3
    figures = preview.locator("figure.example")
    assert figures.count() == 3
    for figure, example in zip(figures.all(), expected["examples"]):
        assert int(figure.get_attribute("data-line")) == example["line"]
        assert 0 < example["num_trained_tokens"] < example["num_tokens"]
        assert figure.locator(".token.trained").count() == example["num_trained_tokens"]
        assert figure.locator(".token").count() == example["num_tokens"] == len(example["tokens"])
        # the text reads as the template rendered it, and the trained run is the assistant's answer
        assert figure.locator("pre .token").all_text_contents() == [token["text"] for token in example["tokens"]]
        trained_text = "".join(figure.locator(".token.trained").all_text_contents())
        assert trained_text == "".join(token["text"] for token in example["tokens"] if token["trained"])
    # marked by more than colour: an underline, and words for screen readers
    decoration = preview.locator("mark.trained-run").first.evaluate("(el) => getComputedStyle(el).textDecorationLine")
    assert "underline" in decoration
    assert preview.locator("mark.trained-run .visually-hidden").first.text_content() == "[trained: "
    page.get_by_text("counts towards the loss").wait_for()  # the legend

    # with train_on_inputs every token carries loss
    page.get_by_label("Train on inputs too (train_on_inputs)").check()
    page.get_by_role("button", name="Show examples").click()
    everything = api.get(f"/v1/files/{uploaded['id']}/preview",
                         params={"model": "tiny-chat", "limit": 3, "train_on_inputs": "true"}).json()
    total = sum(example["num_trained_tokens"] for example in everything["examples"])
    page.wait_for_function("(n) => document.querySelectorAll('[data-testid=preview] .token.trained').length === n",
                           arg=total)
    assert total > sum(example["num_trained_tokens"] for example in expected["examples"])
    assert_fits(page)
    shots(page, "train on inputs")


def test_an_upload_validated_in_the_background_shows_its_progress_then_its_outcome(plane, page, shots, tmp_path):
    plane.plane.platform.settings.upload_validate_wait_s = 0.0  # every upload answers processing
    rows = [chat_example(fact) for fact in demo_facts(40)] * 50  # 2000 rows
    path = write_jsonl(tmp_path / "many.jsonl", rows)
    sign_in(page, plane.url, plane.key_a)
    nav(page, "Files").click()
    page.get_by_role("heading", name="Files").wait_for()
    page.get_by_label("Training data file").set_input_files(str(path))
    page.get_by_role("button", name="Upload").click()
    note = page.get_by_test_id("upload-note")
    note.filter(has_text="Validating many.jsonl").wait_for()
    note.filter(has_text="Uploaded many.jsonl").wait_for()
    link = page.get_by_test_id("uploaded-file")
    file_id = link.inner_text()
    api = client(plane.url, plane.key_a)
    file = api.get(f"/v1/files/{file_id}").json()
    assert file["status"] == "processed" and file["validation"]["rows_checked"] == 2000
    bar = page.get_by_test_id("upload-progress")
    assert bar.evaluate("(el) => el.value === el.max") and bar.evaluate("(el) => el.max") == path.stat().st_size
    link.click()
    page.get_by_test_id("validation-verdict").filter(has_text="passed validation").wait_for()
    shots(page, "validated in the background")


def test_the_dataset_page_of_a_file_still_processing_follows_it_to_its_report(plane, page, monkeypatch):
    plane.plane.platform.settings.upload_validate_wait_s = 0.0
    release = hold_upload_checks(monkeypatch)
    api = client(plane.url, plane.key_a)
    answer = api.post("/v1/files", files={"file": ("held.jsonl", chat_lines(30))}, data={"purpose": "fine-tune"})
    file_id = answer.json()["id"]
    assert answer.json()["status"] == "processing"
    sign_in(page, plane.url, plane.key_a)
    page.goto(f"{plane.url}/console#/files/{file_id}")
    progress = page.get_by_test_id("validation-progress")
    progress.filter(has_text="Validating… 0 rows").wait_for()
    assert page.get_by_test_id("file-facts").locator(".badge").inner_text() == "processing"
    release.set()
    page.get_by_test_id("validation-verdict").filter(has_text="passed validation").wait_for()
    assert page.get_by_test_id("file-facts").locator(".badge").inner_text() == "processed"
    assert progress.count() == 0
