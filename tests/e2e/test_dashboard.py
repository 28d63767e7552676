"""The dashboard in headless Chromium against a real stack: API, worker, trainer, PostgreSQL.

A real worker trains two tiny jobs: a short one that finishes and a long one that is still
running while the browser signs in, watches its loss chart grow, compares the two, submits
an invalid recipe and sees the error at its field, and cancels the running job (the worker
kills its torchrun). Screenshots go to artifacts/screenshots/. Needs Debian's chromium and
chromium-driver (`apt-get install -y chromium chromium-driver`) and the `selenium` package.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "artifacts" / "screenshots"
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()),
        reason="needs /usr/bin/chromium and /usr/bin/chromedriver: "
        "apt-get install -y chromium chromium-driver",
    ),
]
selenium = pytest.importorskip("selenium", reason="needs the selenium package (pip)")

from selenium import webdriver  # noqa: E402
from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402


def wait_until(check: Callable[[], object], timeout: float, what: str, every: float = 0.3):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = check()
        except StaleElementReferenceException:  # the page re-rendered under us: look again
            value = None
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.fixture(scope="module")
def jobs(stack, valid_recipe) -> dict[str, str]:
    """A finished short job and a long job that is running (with metrics) when this returns."""
    stack.start_worker()
    with stack.client() as client:

        def submit(name: str, recipe: str) -> str:
            response = client.post("/v1/jobs", json={"name": name, "recipe_yaml": recipe})
            assert response.status_code == 201, response.text
            return response.json()["id"]

        def status(job_id: str) -> str:
            return client.get(f"/v1/jobs/{job_id}").json()["status"]

        short = submit("short-run", valid_recipe.replace("max_steps: 40", "max_steps: 12"))
        wait_until(lambda: status(short) in ("succeeded", "failed"), 180, "the short job")
        assert status(short) == "succeeded", stack.log("worker")[-3000:]
        long_recipe = valid_recipe.replace("max_steps: 40", "max_steps: 5000")
        long = submit("long-run", long_recipe.replace("num_samples: 64", "num_samples: 40000"))
        metrics = f"/v1/jobs/{long}/metrics"
        wait_until(lambda: client.get(metrics).json()["data"], 180, "the long job's metrics")
        assert status(long) == "running"
    return {"short": short, "long": long}


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="tuneyard-chromium-")
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--window-size=1400,1800",
                 f"--user-data-dir={profile}"):  # fmt: skip
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    SHOTS.mkdir(parents=True, exist_ok=True)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def shot(driver, name: str) -> None:
    driver.save_screenshot(str(SHOTS / f"{name}.png"))


def css(driver, selector: str):
    found = driver.find_elements(By.CSS_SELECTOR, selector)
    return found[0] if found else None


def chart_points(driver, metric: str) -> int:
    element = css(driver, f"#chart-{metric}")
    return int(element.get_attribute("data-points") or 0) if element else 0


def sign_in(driver, key: str) -> None:
    box = wait_until(lambda: css(driver, "#api-key"), 10, "the login form")
    box.clear()
    box.send_keys(key)
    css(driver, "#login-form button[type=submit]").click()


def test_dashboard_end_to_end(stack, jobs, browser, valid_recipe):
    driver, base = browser, stack.url
    invalid_recipe = valid_recipe.replace("lr: 1.0e-3", "lr: 1.0e-3, lrr: 2")
    driver.get(f"{base}/jobs/{jobs['long']}")
    wait_until(lambda: "/login" in driver.current_url, 10, "the redirect to /login")
    sign_in(driver, "ty_not_a_key")
    wait_until(lambda: "refused" in (css(driver, "#login-error").text or ""), 10, "refusal")
    shot(driver, "01-login-refused")

    sign_in(driver, stack.api_key)  # back to the page asked for first
    wait_until(lambda: driver.current_url.endswith(f"/jobs/{jobs['long']}"), 10, "the job page")
    first = wait_until(lambda: chart_points(driver, "loss"), 30, "loss points")
    wait_until(lambda: chart_points(driver, "loss") > first, 60, "the loss chart to grow")
    assert css(driver, "#job-state [data-state=running]")
    assert chart_points(driver, "tps") > 0 and chart_points(driver, "lr") > 0
    # The log panel pages with `cursor` / `next_cursor` as the charts do: lines appended
    # now (two batches, so the second poll starts from the first's cursor) all show, once.
    from jobs.store.engine import session_scope
    from jobs.store.ingest import append_logs

    for batch in (range(0, 3), range(3, 6)):
        with session_scope(stack.settings) as session:
            append_logs(session, jobs["long"], 1,
                        [("stdout", 10**6 + i, f"dashboard line {i}") for i in batch])  # fmt: skip
        wait_until(lambda b=batch: f"dashboard line {b[-1]}" in css(driver, "#log").text, 30,
                   "the appended log lines")  # fmt: skip
    shown = [li for li in css(driver, "#log").text.splitlines() if "dashboard line" in li]
    assert shown == [f"dashboard line {i}" for i in range(6)]
    shot(driver, "02-job-running")

    driver.get(f"{base}/")
    row = wait_until(lambda: css(driver, f"tr[data-job='{jobs['long']}']"), 15, "the job row")
    assert "running" in row.text and "long-run" in row.text
    assert "succeeded" in css(driver, f"tr[data-job='{jobs['short']}']").text
    shot(driver, "03-job-list")

    driver.get(f"{base}/compare?ids={jobs['short']},{jobs['long']}")
    legend = "#compare-chart .u-legend"  # the chart's live legend names each job's curve
    wait_until(lambda: css(driver, legend) and all(n in css(driver, legend).text
                                                   for n in ("short-run", "long-run")),
               20, "two loss curves")  # fmt: skip
    shot(driver, "04-compare")

    driver.get(f"{base}/submit")
    editor = wait_until(lambda: css(driver, "#recipe"), 10, "the recipe editor")
    driver.execute_script("arguments[0].value = arguments[1];", editor, invalid_recipe)
    css(driver, "#validate").click()
    error = wait_until(lambda: css(driver, "li[data-loc='optimizer.lrr']"), 20, "the field error")
    assert "lrr" in error.text and "did you mean 'lr'" in error.text
    line = invalid_recipe.splitlines().index(
        next(li for li in invalid_recipe.splitlines() if "lrr" in li)
    )
    assert f"line {line + 1}" in error.text
    assert css(driver, "#gutter .bad").text.endswith(str(line + 1))
    beside = css(driver, f".editor .line-note[data-line='{line + 1}']")
    assert beside.is_displayed() and "takes no argument 'lrr'" in beside.text
    shot(driver, "05-submit-field-error")

    driver.get(f"{base}/jobs/{jobs['long']}")
    button = wait_until(lambda: css(driver, "#btn-cancel:not([disabled])"), 20, "Cancel")
    button.click()
    wait_until(lambda: css(driver, "#cancel-dialog[open]"), 5, "the cancel confirmation")
    css(driver, "#cancel-confirm").click()
    wait_until(lambda: css(driver, "#job-state [data-state=cancelled]"), 90, "cancelled state")
    assert css(driver, "#btn-cancel").get_attribute("disabled") is not None
    shot(driver, "06-job-cancelled")


def test_an_expired_key_leads_back_to_login(stack, jobs, browser):
    driver = browser
    driver.get(f"{stack.url}/login")
    driver.execute_script("sessionStorage.setItem('tuneyard.apiKey', 'ty_revoked');")
    driver.get(f"{stack.url}/jobs/{jobs['short']}")
    wait_until(lambda: "/login?next=" in driver.current_url, 15, "the redirect to /login")
    assert f"%2Fjobs%2F{jobs['short']}" in driver.current_url
