"""The dashboard's list, job and submit pages in headless Chromium, on jobs seeded through the
store (no training): the list's search, label filter, sorting and pages with "N–M of T",
the failure reason on a failed row, focus kept across the 3 s refresh; the job page's
attempt count after three user pauses (never "Attempt 4 of 3"), events labelled pause and
resume, the cancel confirmation, "clone and edit" into the submit page; the submit page's
plan preview, errors in line order, "apply fix" and procs/node 0 sent as 0.

Needs Debian's chromium and chromium-driver and the `selenium` package, like the other
dashboard tests. Screenshots go to artifacts/screenshots/.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

pytest.importorskip("selenium", reason="needs the selenium package (pip)")

from browser_kit import NEEDS_CHROMIUM, chromium, css, shot, sign_in, wait_until  # noqa: E402
from selenium import webdriver  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select  # noqa: E402

pytestmark = NEEDS_CHROMIUM

PLAN_RECIPE = """\
step_scheduler: {max_steps: 40, global_batch_size: 4, log_interval: 1}
model:
  _target_: tuneyard.models.AutoModelForCausalLM.from_config
  config: {architectures: [LlamaForCausalLM], model_type: llama, vocab_size: 512,
           hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2,
           num_attention_heads: 4, num_key_value_heads: 2}
dataset: {_target_: tuneyard.datasets.MockDataset, vocab_size: 512, seq_length: 32, num_samples: 64}
lr_scheduler:
  min_lr: -1
optimizer:
  _target_: torch.optim.AdamW
  lr: -1  # too small
"""


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    with chromium() as driver:
        yield driver


@pytest.fixture(scope="module")
def signed_in(stack, browser) -> webdriver.Chrome:
    return sign_in(browser, stack)


def _project_id(session) -> int:
    from sqlalchemy import select

    from jobs.store.tables import Project

    return session.scalar(select(Project.id).where(Project.name == "e2e"))


@pytest.fixture(scope="module")
def listed(stack) -> dict[str, str]:
    """60 sweep jobs, one labelled team=nlp, one failed with its reason; straight into the store."""
    from jobs.store import queries as store
    from jobs.store.engine import session_scope

    ids: dict[str, str] = {}
    with session_scope(stack.settings) as session:
        project = _project_id(session)
        for i in range(60):
            labels = {"team": "nlp"} if i == 7 else {}
            new = store.NewJob(name=f"sweep-{i:03d}", spec={}, recipe={}, plan={"max_steps": 10},
                               resources={}, queue="cpu", labels=labels)  # fmt: skip
            ids[new.name] = store.create_job(session, project, new)[0].id
        failed = store.NewJob(name="diverged", spec={}, recipe={}, plan={"max_steps": 10},
                              resources={}, queue="cpu")  # fmt: skip
        ids["diverged"] = store.create_job(session, project, failed)[0].id
    stack.drive(ids["diverged"], "starting", "running", "failed", error_code="nan_loss",
                error_message="loss is nan at step 3 (fix: lower optimizer.lr)")  # fmt: skip
    return ids


def _rows(driver) -> list[str]:
    return [
        a.text for a in driver.find_elements(By.CSS_SELECTOR, "#jobs-table tbody td.name-cell a")
    ]


def test_the_list_searches_filters_sorts_pages_and_keeps_focus(stack, listed, signed_in) -> None:
    driver = signed_in
    driver.get(f"{stack.url}/")
    info = lambda: css(driver, "#page-info").text  # noqa: E731
    wait_until(lambda: info() == "1–50 of 61", 20, "the first page and its count")
    assert driver.title == "Jobs · tuneyard"
    row = css(driver, f"tr[data-job='{listed['diverged']}']")
    assert "nan_loss: loss is nan at step 3" in row.text
    assert css(driver, f"tr[data-job='{listed['diverged']}'] .bar.failed")
    shot(driver, "10-job-list")

    css(driver, "#page-next").click()
    wait_until(lambda: info() == "51–61 of 61", 10, "the second page")
    css(driver, "#page-prev").click()
    wait_until(lambda: info() == "1–50 of 61", 10, "the first page again")

    css(driver, "#job-search").send_keys("SWEEP-01")
    wait_until(lambda: info() == "1–10 of 10", 10, "the search's matches")
    css(driver, "button.sort[data-sort='name']").click()
    wait_until(lambda: _rows(driver)[:2] == ["sweep-010", "sweep-011"], 10, "names A to Z")
    assert css(driver, "th[data-sort-key='name']").get_attribute("aria-sort") == "ascending"
    css(driver, "button.sort[data-sort='name']").click()
    wait_until(lambda: _rows(driver)[0] == "sweep-019", 10, "names Z to A")
    assert "sort=name" not in driver.current_url and "q=SWEEP-01" in driver.current_url

    search = css(driver, "#job-search")
    search.clear()
    search.send_keys(" ")
    label = css(driver, "#label-filter")
    label.send_keys("team=nlp")
    driver.execute_script("arguments[0].dispatchEvent(new Event('change'))", label)
    wait_until(lambda: _rows(driver) == ["sweep-007"], 10, "the labelled job")

    # Focus stays on the checkbox it was on across two refreshes (every 3 s).
    box = css(driver, f"input[data-id='{listed['sweep-007']}']")
    assert box.get_attribute("aria-label") == "Select sweep-007 for comparison"
    driver.execute_script("arguments[0].focus()", box)
    time.sleep(6.5)
    focused = driver.execute_script("return document.activeElement.dataset.id || ''")
    assert focused == listed["sweep-007"]


@pytest.fixture(scope="module")
def paused_thrice(stack, valid_recipe) -> str:
    """A job submitted through the API, then paused and resumed three times (attempt 4),
    with a trainer `preempted` event for each pause and ten train steps."""
    from jobs.store.engine import session_scope
    from jobs.store.ingest import TRAINER_EVENT, upsert_metrics
    from jobs.store.tables import JobEvent

    with stack.client() as client:
        created = client.post("/v1/jobs", json={"name": "paused-thrice", "recipe_yaml": valid_recipe,
                                                "overrides": ["optimizer.lr=0.002"]})  # fmt: skip
        assert created.status_code == 201, created.text
        job_id = created.json()["id"]
    for attempt in (1, 2, 3):
        stack.drive(job_id, "starting", "running", "pausing")
        with session_scope(stack.settings) as session:
            session.add(JobEvent(job_id=job_id, attempt=attempt, kind=TRAINER_EVENT,
                                 message="stopped", data={"event": "preempted", "step": 3 * attempt}))  # fmt: skip
        stack.drive(job_id, "paused", "queued")
    stack.drive(job_id, "starting", "running")
    records = [{"kind": "train", "step": s, "loss": 3.0 - 0.1 * s, "lr": 1e-3, "timestamp": 1e9 + s}
               for s in range(1, 11)]  # fmt: skip
    with session_scope(stack.settings) as session:
        upsert_metrics(session, job_id, 4, records)
    return job_id


def test_the_job_page_counts_pauses_apart_and_clones(
    stack, paused_thrice, signed_in, valid_recipe
) -> None:
    driver = signed_in
    driver.get(f"{stack.url}/jobs/{paused_thrice}")
    facts = wait_until(lambda: css(driver, "dd[data-fact='Failures']"), 20, "the job's facts")
    assert facts.text.startswith("0 of 3 allowed")
    attempt = css(driver, "dd[data-fact='Attempt']").text
    assert attempt.startswith("4 ") and " of 3" not in attempt
    wait_until(
        lambda: css(driver, "dd[data-fact='Step']").text.startswith("10 of 40"), 20, "the step"
    )

    def event_labels() -> list[str]:
        items = driver.find_elements(By.CSS_SELECTOR, "#events li")
        return [li.get_attribute("data-label") for li in items]

    # the events list renders on its own refresh, after the facts
    labels = wait_until(
        lambda: (found := event_labels()).count("resume") == 3 and found, 20, "the events"
    )
    assert "preempt" not in labels and labels.count("pause") >= 3
    assert driver.title == "paused-thrice (running) · tuneyard"
    assert css(driver, "#job-recipe .override[data-path='optimizer.lr']")
    assert "n/a on CPU" in css(driver, "#mfu-note").text
    shot(driver, "11-job-page")

    css(driver, "#btn-cancel").click()
    wait_until(lambda: css(driver, "#cancel-dialog[open]"), 5, "the cancel confirmation")
    shot(driver, "12-cancel-confirmation")
    css(driver, "#cancel-keep").click()
    wait_until(lambda: not css(driver, "#cancel-dialog[open]"), 5, "the dialog to close")
    with stack.client() as client:
        assert client.get(f"/v1/jobs/{paused_thrice}").json()["status"] == "running"

    css(driver, "#btn-clone").click()
    wait_until(lambda: "/submit?from=" in driver.current_url, 10, "the submit page")
    editor = css(driver, "#recipe")
    wait_until(lambda: editor.get_attribute("value") == valid_recipe, 10, "the job's recipe")
    assert css(driver, "#job-name").get_attribute("value") == "paused-thrice-copy"
    assert css(driver, "#overrides").get_attribute("value") == "optimizer.lr=0.002"


def _set_recipe(driver, text: str) -> None:
    editor = css(driver, "#recipe")
    driver.execute_script("arguments[0].value = arguments[1];"
                          "arguments[0].dispatchEvent(new Event('input'));", editor, text)  # fmt: skip


def test_submit_previews_the_plan_orders_errors_and_applies_a_fix(stack, signed_in) -> None:
    driver = signed_in
    driver.get(f"{stack.url}/submit")
    wait_until(lambda: len(Select(css(driver, "#template")).options) > 1, 10, "the templates")
    assert driver.title == "Submit a job · tuneyard"
    _set_recipe(driver, PLAN_RECIPE)
    assert css(driver, "#recipe .y-key") and css(driver, "#recipe .y-comment")
    css(driver, "#validate").click()
    wait_until(
        lambda: len(driver.find_elements(By.CSS_SELECTOR, "#errors li")) >= 2, 20, "the errors"
    )
    locs = [
        li.get_attribute("data-loc") for li in driver.find_elements(By.CSS_SELECTOR, "#errors li")
    ]
    assert locs.index("lr_scheduler.min_lr") < locs.index("optimizer.lr")  # in line order
    shot(driver, "13-submit-errors")

    fix = css(driver, "li[data-loc='optimizer.lr'] button[data-fix]")
    fix.click()
    wait_until(lambda: "lr: 1.0e-5  # too small" in css(driver, "#recipe").get_attribute("value"),
               10, "the fix in the recipe")  # fmt: skip
    wait_until(lambda: len(driver.find_elements(By.CSS_SELECTOR, "#errors li")) == 1, 20,
               "the validation after the first fix")  # fmt: skip
    css(driver, "li[data-loc='lr_scheduler.min_lr'] button[data-fix]").click()
    preview = wait_until(lambda: css(driver, "#plan-preview:not([hidden])"), 20, "the plan preview")
    assert "fsdp2" in css(driver, "dd[data-plan='mesh']").text
    assert "global 4 = micro-batch" in css(driver, "dd[data-plan='batch']").text
    assert len(driver.find_elements(By.CSS_SELECTOR, "dd[data-plan='memory'] ul.parts li")) == 5
    assert "device-hours" in css(driver, "dd[data-plan='time']").text
    assert preview.is_displayed()
    shot(driver, "14-submit-plan")

    nproc = css(driver, "#nproc")
    nproc.clear()
    nproc.send_keys("0")
    css(driver, "#validate").click()
    note = wait_until(lambda: css(driver, ".inline-error[data-loc='resources.nproc_per_node']"), 20,
                      "the procs/node error")  # fmt: skip
    assert note.text


def test_pages_hold_at_800_px(stack, listed, signed_in) -> None:
    driver = signed_in
    driver.set_window_size(800, 1200)
    try:
        driver.get(f"{stack.url}/")
        wait_until(lambda: _rows(driver), 20, "the rows")
        overflow = driver.execute_script(
            "return document.documentElement.scrollWidth - document.documentElement.clientWidth"
        )
        assert overflow <= 0  # the table scrolls inside its panel, the page does not
        heights = driver.execute_script(
            "return [...document.querySelectorAll('td.name-cell a')].map(a => a.getClientRects().length)"
        )
        assert set(heights) == {1}  # no name breaks over lines
        shot(driver, "15-job-list-800px")
    finally:
        driver.set_window_size(1400, 1800)
