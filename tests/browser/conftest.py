"""Debian's Chromium driven by Playwright (no browser downloaded), against a real server whose
HTTP port serves the built settings page (web/dist) and Connect.

Chromium comes from MEMORIA_TEST_CHROMIUM, else /usr/bin/chromium (scripts/chromium.sh
installs Debian's package when missing and root; `make test` runs it). Without a browser or
without the built page the tests fail with what to do: they never skip.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from server.rpc.web import WEB_DIST
from tests.api.conftest import Api, server_settings, serving

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    """One headless Chromium for the session. Playwright's launch gives it a fresh profile
    of its own (a new temporary --user-data-dir, removed on close; it refuses the flag)."""
    executable = os.environ.get("MEMORIA_TEST_CHROMIUM", "/usr/bin/chromium")
    if not os.access(executable, os.X_OK):
        pytest.fail(
            f"no Chromium at {executable}: run scripts/chromium.sh (installs Debian's chromium "
            "as root) or set MEMORIA_TEST_CHROMIUM to a Chromium binary"
        )
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=executable,
            args=CHROMIUM_FLAGS,
        )
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture(scope="module")
def web_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    """One server per module with its HTTP port on loopback (each test is its own person)."""
    if not (WEB_DIST / "index.html").is_file():
        pytest.fail(f"the settings page is not built in {WEB_DIST}: run `make web`")
    tmp_path = tmp_path_factory.mktemp("web-server")
    settings = server_settings("sqlite", None, tmp_path, http_listen="127.0.0.1:0")  # type: ignore[arg-type]
    with serving(settings) as api:
        yield api


class Person:
    """One test's principal: gRPC metadata for the model's side, the page for the person's."""

    def __init__(self, api: Api, page: Page) -> None:
        self.api = api
        self.page = page
        self.principal = f"p-{uuid.uuid4().hex[:8]}"
        self.who = api.who(self.principal)

    def open(self) -> Page:
        """The page, signed in with trusted headers (the server is on loopback)."""
        assert self.api.running.web is not None
        page = self.page
        page.goto(f"http://127.0.0.1:{self.api.running.web.port}/")
        expect(page.locator("body[data-ready='1']")).to_have_count(1)
        page.check("#mode-headers")
        page.fill("#tenant", self.api.tenant)
        page.fill("#principal", self.principal)
        page.click("#connect")
        expect(page.locator("#account")).to_be_visible()
        return page

    def open_history(self) -> None:
        """Shows the History section's list (it is read only while open)."""
        self.page.click("#history-toggle")
        expect(self.page.locator("#history-toggle")).to_have_attribute("aria-expanded", "true")
        expect(self.page.locator("#history-status")).not_to_be_empty()


@pytest.fixture
def person(web_api: Api, browser: Browser, tmp_path: Path) -> Iterator[Person]:
    context = browser.new_context()
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    try:
        yield Person(web_api, page)
    finally:
        context.close()
    assert errors == [], f"the page raised: {errors}"
