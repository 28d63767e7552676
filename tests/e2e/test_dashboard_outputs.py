"""What a job leaves, on its page in headless Chromium (js/job_outputs.js): checkpoints with
why each is kept and the deleted ones with their reason, exports (one started from the form,
a queued one cancelled from its row), the artifact store's answer, and the project's webhook
deliveries about this job. No training and no worker: the job is submitted to a real API
and its checkpoints, a retention deletion, an export and a webhook delivery are written with
the store's own functions, the ones the worker and the API call. Screenshot:
artifacts/screenshots/16-job-outputs.png.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("selenium", reason="needs the selenium package (pip)")

from browser_kit import NEEDS_CHROMIUM, chromium, css, shot, sign_in, wait_until  # noqa: E402
from selenium import webdriver  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

pytestmark = NEEDS_CHROMIUM


@pytest.fixture(scope="module")
def signed_in(stack) -> Iterator[webdriver.Chrome]:
    with chromium() as driver:
        yield sign_in(driver, stack)


@pytest.fixture(scope="module")
def finished_job(stack, valid_recipe) -> dict[str, str]:
    """A job with checkpoints at steps 2, 4 and 6 (step 2 deleted by keep_last), a queued
    export of step 4, and a webhook whose outbox holds a delivery about the job."""
    from jobs.store.engine import session_scope
    from jobs.store.exports import create_export
    from jobs.store.ingest import upsert_checkpoints
    from jobs.store.retention import record_deletion
    from jobs.store.tables import Job
    from jobs.store.webhooks import create_webhook, enqueue_event, job_summary

    with stack.client() as client:
        created = client.post("/v1/jobs", json={"name": "outputs", "recipe_yaml": valid_recipe})
        assert created.status_code == 201, created.text
        job_id = created.json()["id"]
    with session_scope(stack.settings) as session:
        saved = [
            {"event": "checkpoint_saved", "step": s, "path": f"step_{s}", "val_loss": 2.0 / s}
            for s in (2, 4, 6)
        ]
        upsert_checkpoints(session, job_id, 1, saved)
        record_deletion(session, job_id, 2, "step_2", "trainer", "keep_last: 2")
        job = session.get(Job, job_id)
        export_id = create_export(session, job, 4, "merged", True, "float32").id
        url = "https://hooks.example.com/tuneyard"
        create_webhook(session, job.project_id, url, ["checkpoint.published"], "s3cret-value")
        enqueue_event(session, job.project_id, "checkpoint.published", {"job": job_summary(job)})
    return {"job": job_id, "export": export_id}


def test_the_job_page_shows_kept_and_deleted_checkpoints_exports_and_deliveries(
    stack,
    signed_in,
    finished_job,
) -> None:
    driver, job_id = signed_in, finished_job["job"]
    driver.get(f"{stack.url}/jobs/{job_id}")
    rows = wait_until(
        lambda: [r.text for r in driver.find_elements(By.CSS_SELECTOR, "#checkpoints tbody tr[data-step]")],
        30, "the checkpoints",
    )  # fmt: skip
    assert [r.split()[0] for r in rows] == ["4", "6"]  # step 2 was deleted
    assert "latest" in rows[-1]
    deleted = css(driver, "#deleted-checkpoints")
    assert deleted.get_attribute("hidden") is None and css(driver, "#deleted-count").text == "1"
    css(driver, "#deleted-checkpoints summary").click()
    assert "keep_last: 2" in deleted.text and "trainer" in deleted.text

    queued = finished_job["export"]
    row = wait_until(lambda: css(driver, f'#exports tr[data-export="{queued}"]'), 30, "the export")
    assert "queued" in row.text and "merged" in row.text
    css(driver, f'button[data-cancel-export="{queued}"]').click()
    wait_until(
        lambda: "cancelled" in css(driver, f'#exports tr[data-export="{queued}"]').text,
        30, "the export to be cancelled",
    )  # fmt: skip
    steps = [
        o.get_attribute("value")
        for o in driver.find_elements(By.CSS_SELECTOR, "#export-step option")
    ]
    assert steps == ["", "4", "6"]
    driver.find_element(By.CSS_SELECTOR, "#export-step option[value='6']").click()
    css(driver, "#export-merge").click()  # adapter only: sent as merge_lora false
    css(driver, "#export-start").click()
    started = wait_until(
        lambda: [r for r in driver.find_elements(By.CSS_SELECTOR, "#exports tbody tr[data-export]")
                 if r.get_attribute("data-export") != queued],
        30, "the new export",
    )  # fmt: skip
    assert "6" in started[0].text and "queued" in started[0].text

    assert "Nothing stored" in css(driver, "#artifacts tbody").text  # no store configured
    delivery = wait_until(lambda: css(driver, "#deliveries tr[data-delivery]"), 30, "a delivery")
    assert "checkpoint.published" in delivery.text and "pending" in delivery.text
    shot(driver, "16-job-outputs")

    from jobs.store.engine import session_scope
    from jobs.store.tables import Export

    with session_scope(stack.settings) as session:
        made = session.get(Export, started[0].get_attribute("data-export"))
        assert (made.step, made.merge_lora) == (6, False)
