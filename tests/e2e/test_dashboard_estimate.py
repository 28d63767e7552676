"""The job page in headless Chromium shows the plan's memory estimate beside the peaks the
trainer measured on each rank, with the estimate's error against the largest.

A real worker trains one tiny job to the end; the browser signs in and opens its page.
Needs Debian's chromium and chromium-driver and the `selenium` package, like the other
dashboard tests.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()),
        reason="needs /usr/bin/chromium and /usr/bin/chromedriver: "
        "apt-get install -y chromium chromium-driver",
    ),
]
pytest.importorskip("selenium", reason="needs the selenium package (pip)")

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402


def wait_until(check: Callable[[], object], timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def gib_text(value: float) -> str:
    """The dashboard's `bytes()` formatting."""
    units, i = ["B", "KB", "MB", "GB", "TB"], 0
    while value >= 1024 and i < len(units) - 1:
        value, i = value / 1024, i + 1
    return f"{value:.{1 if i else 0}f} {units[i]}"


@pytest.fixture(scope="module")
def finished_job(stack, valid_recipe) -> dict:
    stack.start_worker()
    with stack.client() as client:
        recipe = valid_recipe.replace("max_steps: 40", "max_steps: 4")
        created = client.post("/v1/jobs", json={"name": "memory", "recipe_yaml": recipe})
        assert created.status_code == 201, created.text
        job_id = created.json()["id"]
        wait_until(lambda: client.get(f"/v1/jobs/{job_id}").json()["terminal"], 180, "the job")
        job = client.get(f"/v1/jobs/{job_id}").json()
        assert job["status"] == "succeeded", stack.log("worker")
        events = client.get(f"/v1/jobs/{job_id}/events").json()["data"]
    [finished] = [e["data"] for e in events if (e.get("data") or {}).get("event") == "finished"]
    return {"job": job, "peaks": finished["peak_memory_bytes"]}


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="tuneyard-chromium-")
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--window-size=1400,1800", f"--user-data-dir={profile}"):  # fmt: skip
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def text_of(driver, selector: str) -> str:
    found = driver.find_elements(By.CSS_SELECTOR, selector)
    return found[0].text if found else ""


def test_job_page_shows_estimate_beside_measured_peaks(stack, finished_job, browser) -> None:
    driver, job = browser, finished_job["job"]
    driver.get(f"{stack.url}/login")
    wait_until(lambda: driver.find_elements(By.CSS_SELECTOR, "#api-key"), 10, "the login form")
    driver.find_element(By.CSS_SELECTOR, "#api-key").send_keys(stack.api_key)
    driver.find_element(By.CSS_SELECTOR, "#login-form button[type=submit]").click()
    wait_until(lambda: driver.current_url.rstrip("/") == stack.url, 10, "the job list")
    driver.get(f"{stack.url}/jobs/{job['id']}")
    measured = "#job-memory dd[data-memory='Measured peak (finished)']"
    shown = wait_until(lambda: text_of(driver, measured), 20, "the measured peaks")
    peaks = finished_job["peaks"]
    total = job["plan"]["estimate"]["memory_per_rank_bytes"]["total"]
    for rank, peak in enumerate(peaks):
        assert f"rank {rank} {gib_text(peak)}" in shown
    top = max(peaks)
    assert f"estimate {(total - top) / top * 100:.1f}% off" in shown
    estimate = text_of(driver, "#job-memory dd[data-memory='Memory estimate']")
    assert estimate.startswith(f"{gib_text(total)} per rank (params ")
