"""Steps the browser tests share: signing in, reading the API beside the page, layout checks."""

from __future__ import annotations

import io
import json
import time
from typing import Any

import httpx

JOB_TIMEOUT_S = 300


def sign_in(page, url: str, key: str) -> None:  # noqa: ANN001 - a Playwright Page
    page.goto(f"{url}/console")
    page.get_by_label("API key").fill(key)
    page.get_by_role("button", name="Sign in").click()
    page.locator("#nav a").first.wait_for()


def client(url: str, key: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60)


def upload_rows(api: httpx.Client, rows: list[dict[str, Any]] | bytes, name: str, purpose: str = "fine-tune") -> dict:
    data = rows if isinstance(rows, bytes) else "".join(json.dumps(row) + "\n" for row in rows).encode()
    answer = api.post("/v1/files", files={"file": (name, io.BytesIO(data))}, data={"purpose": purpose})
    assert answer.status_code == 200, answer.text
    file = answer.json()
    deadline = time.monotonic() + 120
    while file["status"] == "processing" and time.monotonic() < deadline:  # validated in the background
        time.sleep(0.1)
        file = api.get(f"/v1/files/{file['id']}").json()
    return file


def all_events(api: httpx.Client, job_id: str) -> list[dict]:
    """Every event of the job, through the paged list (newest first), as the API reports them."""
    events, after = [], None
    while True:
        params = {"limit": 100, **({"after": after} if after else {})}
        page = api.get(f"/v1/fine_tuning/jobs/{job_id}/events", params=params)
        assert page.status_code == 200, page.text
        body = page.json()
        events += body["data"]
        if not body["has_more"] or not body["data"]:
            return events
        after = body["data"][-1]["id"]


def metric_points(events: list[dict], key: str) -> int:
    """How many metric events carry a number under `key`: the points its chart must plot."""
    return sum(1 for event in events if event["type"] == "metrics" and isinstance(event["data"].get("step"), int)
               and isinstance(event["data"].get(key), (int, float)))


def wait_for_job(api: httpx.Client, job_id: str, statuses=("succeeded", "failed", "cancelled")) -> dict:
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while time.monotonic() < deadline:
        job = api.get(f"/v1/fine_tuning/jobs/{job_id}").json()
        if job["precise_status"] in statuses:
            return job
        time.sleep(0.3)
    raise AssertionError(f"{job_id} still {job['precise_status']} after {JOB_TIMEOUT_S}s")


def horizontal_overflow(page) -> int:  # noqa: ANN001
    """Pixels the page is wider than the window (0: no horizontal scrolling)."""
    return page.evaluate("() => Math.max(document.documentElement.scrollWidth, document.body.scrollWidth)"
                         " - document.documentElement.clientWidth")


def assert_fits(page) -> None:  # noqa: ANN001
    overflow = horizontal_overflow(page)
    assert overflow <= 0, f"the page scrolls sideways by {overflow}px at {page.viewport_size}"


# Records every value the `data-points` attribute of each chart line takes, in order, however
# the page batches its updates (a MutationObserver with attributeOldValue sees each change).
OBSERVE_CHART_POINTS = """() => {
  window.__pointHistory = {};
  const observer = new MutationObserver((records) => {
    for (const record of records) {
      const series = record.target.getAttribute('data-series');
      if (!series) continue;
      const seen = window.__pointHistory[series] || (window.__pointHistory[series] = []);
      const old = Number(record.oldValue || 0);
      if (!seen.length || seen[seen.length - 1] !== old) seen.push(old);
    }
    for (const line of document.querySelectorAll('polyline[data-series]')) {
      const seen = window.__pointHistory[line.getAttribute('data-series')];
      const now = Number(line.getAttribute('data-points'));
      if (seen && seen[seen.length - 1] !== now) seen.push(now);
    }
  });
  observer.observe(document.body, {subtree: true, attributes: true, attributeOldValue: true,
                                   attributeFilter: ['data-points']});
}"""


def point_history(page, series: str) -> list[int]:  # noqa: ANN001
    return page.evaluate("(series) => (window.__pointHistory || {})[series] || []", series)


def plotted_points(page, chart: str, series: str) -> int:  # noqa: ANN001
    """The vertices of the series' line as drawn (its `points` attribute)."""
    points = page.locator(f'[data-chart="{chart}"] polyline[data-series="{series}"]').get_attribute("points") or ""
    return len(points.split())


def nav(page, name: str):  # noqa: ANN001, ANN201 - a Playwright Page and Locator
    """A link of the console's main navigation."""
    return page.get_by_role("navigation", name="Main").get_by_role("link", name=name, exact=True)



def load_every_event(page) -> int:  # noqa: ANN001
    """Follow the events panel's "older" button until the API has no older page; the events it holds."""
    count = page.get_by_test_id("event-count")
    older = page.get_by_test_id("events-older")
    while older.is_visible():
        held = int(count.get_attribute("data-loaded"))
        older.click()  # (Playwright waits until the button is enabled again after the last page)
        page.wait_for_function("(n) => Number(document.querySelector('[data-testid=event-count]').dataset.loaded) > n",
                               arg=held)
    return int(count.get_attribute("data-loaded"))
