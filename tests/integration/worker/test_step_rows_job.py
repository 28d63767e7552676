"""A job killed mid-run, through the real worker and trainer: the resumed attempt proves
its resume (`resume_verified` in the job's events) and `GET /v1/jobs/{id}/steps/{step}/samples`
answers exactly the rows the sampler gave each step, asked before the kill and after the
resume, the re-run steps answered by the attempt that really used them; the job's events
in the API list the proof."""

from __future__ import annotations

import pytest
from worker_harness import events_of, insert_job, job_row, tiny_recipe, train_steps, wait_for

from trainer.data.sampler import ResumableBatchSampler

pytestmark = pytest.mark.slow
STEPS, CHECKPOINT_EVERY, BATCH = 60, 20, 4


def sampler_rows(num_samples: int, steps: int) -> dict[int, list[int]]:
    """Step -> dataset indices of a one-rank run (tiny_recipe: seed 0, 4 rows a step)."""
    sampler = ResumableBatchSampler(num_samples, BATCH, 0, 1, shuffle=True, seed=0)
    batches: list[list[int]] = []
    epoch = 0
    while len(batches) < steps:
        sampler.load_state_dict({"epoch": epoch, "batches_done": 0})
        batches += list(iter(sampler))
        epoch += 1
    return {step: batches[step - 1] for step in range(1, steps + 1)}


def test_killed_job_resumes_verified_and_serves_each_steps_rows(project_id, procs, tiny_assets):
    from fastapi.testclient import TestClient

    from api.main import create_app

    expected = sampler_rows(256, STEPS)
    job_id = insert_job(project_id, tiny_recipe(tiny_assets, STEPS, checkpoint_every=20))
    procs.scheduler()
    procs.worker("w1", trainer=None)
    with TestClient(create_app()) as client:

        def rows(step: int) -> tuple[int, list[int]] | None:
            answer = client.get(f"/v1/jobs/{job_id}/steps/{step}/samples")
            if answer.status_code != 200:
                return None
            body = answer.json()
            return body["attempt"], [r["index"] for r in body["data"]]

        wait_for(lambda: rows(25), 120, "step 25's rows in the API", procs)
        procs.kill("w1")
        before = {step: rows(step) for step in (5, 25)}
        assert before == {5: (1, expected[5]), 25: (1, expected[25])}
        procs.worker("w2", trainer=None)
        row = wait_for(lambda: job_row(job_id).status in ("succeeded", "failed") and job_row(job_id),
                       180, "the job to finish on w2", procs)  # fmt: skip
        assert (row.status, row.attempt) == ("succeeded", 2), procs.logs()
        after = {step: rows(step) for step in range(1, STEPS + 1)}
        missing = client.get(f"/v1/jobs/{job_id}/steps/{STEPS + 1}/samples")
        other = client.get("/v1/jobs/not-a-job/steps/1/samples")
        listed = client.get(f"/v1/jobs/{job_id}/events", params={"limit": 1000}).json()["data"]
    proofs = [e for e in listed if (e.get("data") or {}).get("event") == "resume_verified"]
    assert (
        proofs and proofs[0]["attempt"] == 2 and "resume_verified at step" in proofs[0]["message"]
    )
    assert train_steps(job_id) == list(range(1, STEPS + 1))
    trainer_events = [e for e in events_of(job_id) if e.kind == "trainer"]
    verified = [e for e in trainer_events if e.data.get("event") == "resume_verified"]
    resumed_at = verified[0].data["step"] if verified else None
    assert verified and verified[0].attempt == 2 and resumed_at >= 20  # LATEST: 20, 40 or
    # the step the interrupted trainer saved at when w2 stopped it (SIGTERM)
    assert not [e for e in trainer_events if e.data.get("event") == "resume_mismatch"]
    for step, (attempt, indices) in after.items():
        assert indices == expected[step], step
        assert attempt == (1 if step <= resumed_at else 2), step  # re-run steps: attempt 2
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    assert other.status_code == 404
