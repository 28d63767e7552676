"""What the dashboard's browser tests share: where Debian's Chromium lives (and the marks that
skip without it), a headless Chromium signed in with the stack's admin key, waiting for a
condition across re-renders, the first element of a selector, and screenshots under
artifacts/screenshots/. Test modules import it after `pytest.importorskip("selenium")`."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
SHOTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"
NEEDS_CHROMIUM = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()),
        reason="needs /usr/bin/chromium and /usr/bin/chromedriver: "
        "apt-get install -y chromium chromium-driver",
    ),
]


@contextlib.contextmanager
def chromium() -> Iterator[webdriver.Chrome]:
    """A headless Chromium with a throwaway profile, 1400 x 1800."""
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="tuneyard-chromium-")
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--window-size=1400,1800",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def sign_in(driver: webdriver.Chrome, stack: Any) -> webdriver.Chrome:
    """Store the stack's admin key where the dashboard's login page keeps it."""
    driver.get(f"{stack.url}/login")
    driver.execute_script("sessionStorage.setItem('tuneyard.apiKey', arguments[0]);", stack.api_key)
    return driver


def wait_until(check: Callable[[], object], timeout: float, what: str) -> Any:
    """`check()`'s first truthy value within `timeout` seconds (an element replaced by a
    re-render counts as not yet)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = check()
        except StaleElementReferenceException:
            value = None
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def css(driver: webdriver.Chrome, selector: str) -> Any:
    found = driver.find_elements(By.CSS_SELECTOR, selector)
    return found[0] if found else None


def shot(driver: webdriver.Chrome, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(SHOTS / f"{name}.png"))
