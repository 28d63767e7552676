"""The job page in headless Chromium: clicking a point of the loss chart lists the dataset
rows of that step, exactly as `GET /v1/jobs/{id}/steps/{step}/samples` gives them.

A real worker trains one tiny job to the end; the browser signs in, opens its page, clicks
the loss chart and reads the rows panel. Needs Debian's chromium and chromium-driver and
the `selenium` package, like the other dashboard test.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
SHOTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"
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
from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402


def wait_until(check: Callable[[], object], timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = check()
        except StaleElementReferenceException:
            value = None
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.fixture(scope="module")
def finished_job(stack, valid_recipe) -> str:
    stack.start_worker()
    with stack.client() as client:
        recipe = valid_recipe.replace("max_steps: 40", "max_steps: 16")
        created = client.post("/v1/jobs", json={"name": "rows", "recipe_yaml": recipe})
        assert created.status_code == 201, created.text
        job_id = created.json()["id"]
        wait_until(lambda: client.get(f"/v1/jobs/{job_id}").json()["terminal"], 180, "the job")
        assert client.get(f"/v1/jobs/{job_id}").json()["status"] == "succeeded", stack.log("worker")
    return job_id


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="tuneyard-chromium-")
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--window-size=1400,1800",
                 f"--user-data-dir={profile}"):  # fmt: skip
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def css(driver, selector: str):
    found = driver.find_elements(By.CSS_SELECTOR, selector)
    return found[0] if found else None


def shown_rows(driver) -> list[tuple[int, str]]:
    cells = driver.find_elements(By.CSS_SELECTOR, "#step-rows tbody tr[data-index]")
    return [(int(tr.get_attribute("data-index")), tr.find_elements(By.TAG_NAME, "td")[-1].text)
            for tr in cells]  # fmt: skip


def click_loss_chart(driver, stack, job_id: str, fraction: float) -> int:
    """Click the loss chart at `fraction` of its width from the centre; check the rows panel
    shows the API's rows of the step it names; return that step."""
    svg = css(driver, "#chart-loss .u-over")  # uPlot's event layer over the plot
    ActionChains(driver).move_to_element_with_offset(
        svg, int(svg.size["width"] * fraction), 0
    ).click().perform()
    title = wait_until(lambda: css(driver, "#rows-step").text.isdigit(), 10, "the step title")
    step = int(css(driver, "#rows-step").text) if title else 0
    with stack.client() as client:
        answer = client.get(f"/v1/jobs/{job_id}/steps/{step}/samples")
    assert answer.status_code == 200, answer.text
    expected = [(r["index"], r["preview"] or "") for r in answer.json()["data"]]
    assert len(expected) == 4  # global_batch_size 4 on one rank
    panel = f"#rows-panel[data-step='{step}']"
    wait_until(lambda: css(driver, panel) and shown_rows(driver) == expected, 10, "the rows")
    return step


def test_clicking_a_loss_point_lists_that_steps_rows(stack, finished_job, browser) -> None:
    driver = browser
    driver.get(f"{stack.url}/login")
    box = wait_until(lambda: css(driver, "#api-key"), 10, "the login form")
    box.send_keys(stack.api_key)
    css(driver, "#login-form button[type=submit]").click()
    wait_until(lambda: driver.current_url.rstrip("/") == stack.url, 10, "the job list")
    driver.get(f"{stack.url}/jobs/{finished_job}")
    chart = wait_until(lambda: css(driver, "#chart-loss[data-points]"), 20, "the loss chart")
    wait_until(lambda: int(chart.get_attribute("data-points")) >= 16, 20, "every loss point")
    early = click_loss_chart(driver, stack, finished_job, -0.3)
    late = click_loss_chart(driver, stack, finished_job, 0.3)  # the panel follows the click
    assert 1 <= early < late <= 16
    SHOTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(SHOTS / "07-step-rows.png"))
