"""The console's shell: how it is served, signing in (by keyboard alone), the operator's
views, that the page talks to its own origin only, and that it fits a 1366×768 screen."""

from __future__ import annotations

import re
from importlib import resources

import httpx
import pytest

from tests.browser.conftest import ADMIN_KEY
from tests.browser.steps import assert_fits, nav, sign_in
from tuneforge.console.routes import CONSOLE_CSP, static_files

pytestmark = [pytest.mark.browser, pytest.mark.sqlite_pass_only]

TENANT_VIEWS = {"#/jobs": "Fine-tuning jobs", "#/jobs/new": "New fine-tuning job", "#/files": "Files",
                "#/models": "Models", "#/routes": "Routes", "#/sweeps": "Sweeps", "#/usage": "Usage",
                "#/playground": "Playground"}


def test_the_console_is_served_from_the_package_with_a_strict_csp(plane):
    packaged = resources.files("tuneforge.console").joinpath("static")
    for path in ("/console", "/console/"):
        answer = httpx.get(plane.url + path)
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/html")
        assert answer.content == packaged.joinpath("index.html").read_bytes()
    files = static_files()
    assert {"index.html", "console.css", "js/app.js", "js/chart.js", "js/sse.js"} <= set(files)
    for name, body in files.items():
        answer = httpx.get(f"{plane.url}/console/{name}")
        assert answer.status_code == 200, name
        assert answer.content == body, name
        csp = answer.headers["content-security-policy"]
        assert csp == CONSOLE_CSP
        assert "default-src 'self'" in csp and "'unsafe-inline'" not in csp and "'unsafe-eval'" not in csp
        assert answer.headers["x-content-type-options"] == "nosniff"
    assert httpx.get(f"{plane.url}/console/js/app.js").headers["content-type"].startswith("text/javascript")
    # only the package's files answer: nothing else under /console, nothing outside the folder
    for missing in ("/console/nope.js", "/console/../pyproject.toml", "/console/js/../../routes.py"):
        assert httpx.get(plane.url + missing).status_code == 404, missing
    # no inline script or style in the page: the CSP would block it
    index = files["index.html"].decode()
    assert "<script>" not in index and "style=" not in index and "<style" not in index


def test_keyboard_alone_signs_in_and_moves_between_views(plane, page, shots):
    page.goto(f"{plane.url}/console")
    # a wrong key first: the API's own error message is shown
    refused = httpx.get(f"{plane.url}/v1/models", headers={"Authorization": "Bearer tf-wrong"})
    expected = refused.json()["error"]["message"]
    key_input = page.get_by_label("API key")
    assert page.evaluate("() => document.activeElement.name") == "api-key"
    page.keyboard.type("tf-wrong")
    page.keyboard.press("Enter")
    page.get_by_role("alert").filter(has_text=expected).wait_for()
    assert page.locator("#signin-error").inner_text() == expected
    shots(page, "wrong key")

    key_input.focus()
    page.keyboard.press("Control+A")
    page.keyboard.type(plane.key_a)
    page.keyboard.press("Tab")  # past the help text to the button
    assert page.evaluate("() => document.activeElement.textContent") == "Sign in"
    outline = page.evaluate("() => getComputedStyle(document.activeElement).outlineStyle")
    assert outline != "none", "the focused button shows no focus ring"
    page.keyboard.press("Enter")
    page.get_by_role("heading", name="Fine-tuning jobs").wait_for()
    shots(page, "signed in")

    # the key lives in this tab's sessionStorage only
    assert plane.key_a not in page.url
    assert page.evaluate("() => Object.values(sessionStorage)").count(plane.key_a) == 1
    assert page.evaluate("() => Object.keys(localStorage).length") == 0
    assert page.evaluate("(key) => document.cookie.includes(key)", plane.key_a) is False

    # Tab through the header to the "Files" link and follow it with Enter
    for _ in range(20):
        page.keyboard.press("Tab")
        if page.evaluate("() => document.activeElement.textContent") == "Files":
            break
    else:
        pytest.fail("the Files link cannot be reached with Tab")
    page.keyboard.press("Enter")
    page.get_by_role("heading", name="Files").wait_for()
    assert page.url.endswith("#/files")
    assert page.locator('#nav a[aria-current="page"]').inner_text() == "Files"
    shots(page, "files by keyboard")

    # signing out forgets the key
    page.get_by_role("button", name="Sign out").click()
    page.get_by_role("heading", name="Sign in").wait_for()
    assert page.evaluate("() => sessionStorage.length") == 0


def test_the_admin_key_shows_the_operators_views(plane, page, shots):
    sign_in(page, plane.url, ADMIN_KEY)
    page.get_by_role("heading", name="Tenants").wait_for()
    assert page.locator("#who").inner_text() == "Operator"
    assert [a.inner_text() for a in page.locator("#nav a").all()] == ["Tenants", "Queue", "Usage"]
    rows = page.locator('[data-testid="tenants-table"] tbody tr')
    assert sorted(rows.locator("td:first-child").all_inner_texts()) == ["acme", "globex"]
    shots(page, "tenants")

    nav(page, "Queue").click()
    page.get_by_role("heading", name="Queue").wait_for()
    queue = httpx.get(f"{plane.url}/v1/admin/queue", headers={"Authorization": f"Bearer {ADMIN_KEY}"}).json()["data"]
    if queue:
        assert page.locator('[data-testid="queue-table"] tbody tr').count() == len(queue)
    else:
        page.get_by_test_id("queue-empty").wait_for()
    shots(page, "queue")

    nav(page, "Usage").click()
    page.get_by_role("heading", name="Usage across tenants").wait_for()
    usage_rows = page.locator('[data-testid="admin-usage"] tbody tr')
    assert sorted(usage_rows.locator("td:first-child").all_inner_texts()) == ["acme", "globex"]
    assert_fits(page)
    shots(page, "usage")

    # a tenant's page is not the operator's
    page.goto(f"{plane.url}/console#/jobs")
    page.get_by_role("heading", name="Not available").wait_for()


def test_the_page_loads_everything_from_its_own_origin_and_fits_a_laptop_screen(plane, page, shots):
    sign_in(page, plane.url, plane.key_a)
    for view, heading in TENANT_VIEWS.items():
        page.goto(f"{plane.url}/console{view}")
        page.get_by_role("heading", name=heading, exact=True).wait_for()
        assert page.locator("#error").is_hidden(), page.locator("#error").inner_text()
        assert_fits(page)
        shots(page, view)
    requests = page.record.requests
    assert any(url.endswith("/console/js/app.js") for url in requests)
    assert any("/v1/models" in url for url in requests)
    foreign = [url for url in requests if not url.startswith(plane.url + "/")]
    assert not foreign, f"requests outside the plane's origin: {foreign}"
    # every script the page ran came from the package
    scripts = page.evaluate("() => performance.getEntriesByType('resource')"
                            ".filter((e) => e.initiatorType === 'script' || e.name.endsWith('.js')).map((e) => e.name)")
    packaged = {f"{plane.url}/console/{name}" for name in static_files() if name.endswith(".js")}
    assert scripts and set(scripts) <= packaged


def test_a_view_that_finishes_loading_after_the_next_one_is_shown_does_not_replace_it(plane, page):
    held = []  # the jobs list's answer, the start page's, is held until the next page is drawn
    page.route(re.compile(r".*/v1/fine_tuning/jobs\?.*"), lambda route: held.append(route))
    sign_in(page, plane.url, plane.key_a)
    page.goto(f"{plane.url}/console#/files")
    page.get_by_role("heading", name="Files", exact=True).wait_for()
    assert len(held) == 1
    with page.expect_response(re.compile(r".*/v1/fine_tuning/jobs\?.*")):
        held[0].continue_()
    page.evaluate("() => new Promise((done) => setTimeout(done, 200))")  # the late view's await resumes
    assert page.locator("#main h1").all_inner_texts() == ["Files"]
    page.unroute(re.compile(r".*/v1/fine_tuning/jobs\?.*"))
    nav(page, "Jobs").click()  # the jobs page itself still draws when it is the current one
    page.get_by_role("heading", name="Fine-tuning jobs").wait_for()
