"""What the browser tests share: Debian's Chromium (never downloaded: the machine's
network is closed), where screenshots go, and the flags the browser runs with."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from playwright.sync_api import Browser, FloatRect, Locator, Page

from tests.conftest import IN_CI

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
DOCS_SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"


@pytest.fixture
def chromium() -> str:
    if not os.access(CHROMIUM, os.X_OK):
        message = f"no Chromium at {CHROMIUM} (apt-get install chromium)"
        if IN_CI:
            pytest.fail(f"{message}: CI must run the browser test")
        pytest.skip(message)
    return CHROMIUM


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    root = os.environ.get("DUETIME_ARTIFACTS")
    directory = Path(root) / "dashboard" if root else tmp_path / "screenshots"
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def publish(shots: Path) -> None:
    """With DUETIME_UPDATE_SCREENSHOTS=1, copy the screenshots taken to docs/screenshots/."""
    if os.environ.get("DUETIME_UPDATE_SCREENSHOTS") == "1":
        DOCS_SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        for shot in sorted(shots.glob("*.png")):
            shutil.copy(shot, DOCS_SCREENSHOTS / shot.name)


def settled_box(locator: Locator) -> FloatRect:
    """The element's box. The pages refresh themselves (every second in these tests),
    and while a refresh swaps the element out it has no box for a moment: look again."""
    deadline = time.monotonic() + 5
    while (box := locator.bounding_box()) is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert box is not None, f"{locator} has no box"
    return box


def signed_in_page(browser: Browser, base: str, token: str) -> Page:
    """A page at 1280 x 900 in Berlin's zone, signed in with ``token``, that accepts the
    dashboard's confirmation dialogs."""
    context = browser.new_context(
        viewport={"width": 1280, "height": 900}, timezone_id="Europe/Berlin"
    )
    page = context.new_page()
    page.on("dialog", lambda dialog: dialog.accept())
    page.goto(f"{base}/login")
    page.fill("input[name=token]", token)
    page.click("button[type=submit]")
    return page
