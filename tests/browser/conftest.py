"""The console in a real browser: headless Chromium (Debian's package) driven by Playwright
against a real control plane with its scheduler on 127.0.0.1.

`scripts/browser-deps.sh` installs both. Without them the tests are skipped, saying what is
missing, except under CI (`CI=true`), where a missing browser is a failure. Screenshots of
each step go to `$TUNEFORGE_TEST_ARTIFACTS` (default `test-artifacts/browser/`).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.e2e.conftest import Running, start_plane

CHROMIUM = os.environ.get("TUNEFORGE_CHROMIUM", "/usr/bin/chromium")
ADMIN_KEY = "tf-admin-browser-tests"
VIEWPORT = {"width": 1366, "height": 768}
ARTIFACTS = Path(os.environ.get("TUNEFORGE_TEST_ARTIFACTS", "test-artifacts/browser"))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "browser: drives the web console in headless Chromium (tests/browser)")


def _missing() -> str | None:
    """What the browser tests lack, or None."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright for Python is not installed (run scripts/browser-deps.sh)"
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)) and not shutil.which(CHROMIUM):
        return f"no chromium at {CHROMIUM} (run scripts/browser-deps.sh, or set TUNEFORGE_CHROMIUM)"
    return None


# package scope: Playwright's synchronous API keeps an event loop running in this thread while it is
# open, which would break every later test that runs one of its own (asyncio.run); it closes once
# the browser tests are done
@pytest.fixture(scope="package")
def browser() -> Iterator[object]:
    missing = _missing()
    if missing:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"the browser tests must run in CI: {missing}")
        pytest.skip(missing)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        # no sandbox: CI runs as root, where Chromium's sandbox refuses to start
        launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                              args=["--no-sandbox", "--disable-dev-shm-usage"])
        yield launched
        launched.close()


def console_installed(app) -> bool:  # noqa: ANN001 - a FastAPI app
    return any(getattr(route, "path", "") == "/console" for route in app.routes)


@pytest.fixture
def plane(tmp_path: Path, database_url: str, tiny_model_dir: Path) -> Iterator[Running]:
    """A control plane with its scheduler and the console, tenants `acme` (key_a) and
    `globex` (key_b), the base model "tiny-chat", and the admin key ADMIN_KEY."""
    world = start_plane(tmp_path, database_url, tiny_model_dir, admin_api_key=ADMIN_KEY)
    try:
        if not console_installed(world.plane.app):
            from tuneforge import console

            console.install(world.plane.app)
        yield world
    finally:
        world.close()


@dataclass
class Shots:
    """Screenshots of a test's steps, numbered in order, in ARTIFACTS/<test name>/."""

    folder: Path
    taken: list[Path] = field(default_factory=list)

    def __call__(self, page, label: str) -> Path:  # noqa: ANN001 - a Playwright Page
        path = self.folder / f"{len(self.taken) + 1:02d}-{re.sub(r'[^a-z0-9]+', '-', label.lower()).strip('-')}.png"
        page.screenshot(path=str(path), full_page=True)
        self.taken.append(path)
        return path


@pytest.fixture
def shots(request: pytest.FixtureRequest) -> Shots:
    folder = ARTIFACTS / re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    return Shots(folder)


@dataclass
class PageRecord:
    """What the page did besides what a test looks at: requests, script errors, console errors."""

    requests: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)


@pytest.fixture
def page(browser, plane: Running) -> Iterator[object]:  # noqa: ANN001
    """A fresh browser context (1366×768, no shared storage) and page; after the test, the page
    must have thrown no script error."""
    context = browser.new_context(viewport=VIEWPORT, accept_downloads=True)
    context.set_default_timeout(30_000)
    opened = context.new_page()
    record = PageRecord()
    opened.on("request", lambda req: record.requests.append(req.url))
    opened.on("pageerror", lambda error: record.page_errors.append(str(error)))
    opened.on("console", lambda msg: record.console_errors.append(msg.text) if msg.type == "error" else None)
    opened.record = record
    try:
        yield opened
    finally:
        context.close()
    assert not record.page_errors, f"the console threw: {record.page_errors}"
