"""What the browser tests share: Debian's Chromium driven by Playwright (never a downloaded browser), and logging in
as one of the users tests/conftest.py makes."""

import os
import time
from contextlib import contextmanager

import pytest

CHROMIUM = "/usr/bin/chromium"
needs_chromium = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"Debian's Chromium is not installed at "
                                                                         f"{CHROMIUM} (apt-get install -y chromium)")


@contextmanager
def chromium():
    """A headless Chromium for the length of the block. Playwright runs an event loop in this thread, where Django
    refuses database calls: a test makes its rows before it opens the browser."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (no browser download)")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync"])
        try:
            yield browser
        finally:
            browser.close()


def log_in(page, live_server, username):
    """Logs in through the login page as `username` (its password is "<username>-pass-123", as tests/conftest.py
    makes it)."""
    page.goto(f"{live_server.url}/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", f"{username}-pass-123")
    page.click("main button[type=submit]")
    page.wait_for_url(f"{live_server.url}/")


def wait_until(page, expression: str, timeout_ms: int = 10_000) -> None:
    """Waits until `expression` is true in the page. Playwright's wait_for_function evaluates its predicate with eval,
    which the pages' Content-Security-Policy refuses; page.evaluate is not subject to it."""
    deadline = time.monotonic() + timeout_ms / 1000
    while not page.evaluate(expression):
        assert time.monotonic() < deadline, f"not true within {timeout_ms} ms: {expression}"
        page.wait_for_timeout(100)
