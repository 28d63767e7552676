"""Claiming a job re-checks the grants its stored recipe needs, at every attempt
(jobs.orchestration.claims), on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from jobs.orchestration.claims import GRANT_REVOKED, claim_job
from jobs.orchestration.policy import retry_or_fail
from jobs.orchestration.states import request_control, transition
from jobs.recipe.plan.grants import REMOTE_CODE
from jobs.store.api_keys import set_remote_code
from jobs.store.queries import lock_job
from jobs.store.status import JobStatus
from jobs.store.tables import Job, JobEvent, Project

NEEDS_REMOTE_CODE = {
    "model": {"_target_": "tuneyard.models.AutoModelForCausalLM.from_pretrained",
              "pretrained_model_name_or_path": "/models/custom", "trust_remote_code": True},
}  # fmt: skip


def queued_job(session: Session, project: Project, recipe: dict) -> str:
    job = Job(project_id=project.id, name="j", recipe=recipe, status=JobStatus.QUEUED)
    session.add(job)
    session.commit()
    return job.id


def grant(session: Session, project: Project, allowed: bool) -> None:
    set_remote_code(session, project.id, allowed)
    session.commit()


def claim(session: Session, job_id: str, operator_grants=()):
    claimed = claim_job(session, job_id, "w1", 30, "/tmp/run", operator_grants=operator_grants)
    session.commit()
    return claimed, lock_job(session, job_id)


def test_a_granted_job_is_claimed(session, project):
    grant(session, project, True)
    claimed, job = claim(session, queued_job(session, project, NEEDS_REMOTE_CODE))
    assert claimed is not None and job.status == JobStatus.STARTING and job.attempt == 1


def test_a_job_whose_grant_was_revoked_fails_at_its_claim(session, project):
    grant(session, project, True)
    job_id = queued_job(session, project, NEEDS_REMOTE_CODE)
    grant(session, project, False)
    claimed, job = claim(session, job_id)
    assert claimed is None and job.status == JobStatus.FAILED
    assert job.attempt == 0 and job.lease_owner is None and job.finished_at is not None
    assert job.error_code == GRANT_REVOKED
    assert job.error_message.startswith("model.trust_remote_code: ")
    assert "revoked after submission" in job.error_message
    assert "grant it again" in job.error_message and "resubmit" in job.error_message
    event = session.scalars(select(JobEvent).where(JobEvent.job_id == job_id)).one()
    assert (event.from_status, event.to_status) == (JobStatus.QUEUED, JobStatus.FAILED)
    assert event.data["code"] == GRANT_REVOKED and event.data["worker"] == "w1"
    assert event.data["grants"] == {REMOTE_CODE: "model.trust_remote_code"}
    assert "model.trust_remote_code" in event.message


def test_the_operators_setting_still_allows_it(session, project):
    job_id = queued_job(session, project, NEEDS_REMOTE_CODE)
    claimed, job = claim(session, job_id, operator_grants={REMOTE_CODE})
    assert claimed is not None and job.status == JobStatus.STARTING


def test_a_recipe_that_needs_no_grant_is_claimed_without_one(session, project):
    claimed, job = claim(session, queued_job(session, project, {"fake": {"steps": 3}}))
    assert claimed is not None and job.status == JobStatus.STARTING


def _retried(session: Session, job: Job) -> None:
    retry_or_fail(session, job, "crash", "boom", {})


def _resumed(session: Session, job: Job) -> None:
    transition(session, job.id, JobStatus.PAUSING, reason="pause", attempt=job.attempt)
    transition(session, job.id, JobStatus.PAUSED, reason="paused", attempt=job.attempt)
    request_control(session, job.id, "resume", reason="resume")


@pytest.mark.parametrize("requeue", [_retried, _resumed], ids=["retry", "resume"])
def test_the_next_attempt_asks_again(session, project, requeue):
    grant(session, project, True)
    job_id = queued_job(session, project, NEEDS_REMOTE_CODE)
    first, job = claim(session, job_id)
    assert first is not None and first.attempt == 1
    transition(session, job_id, JobStatus.RUNNING, reason="started", attempt=1)
    requeue(session, lock_job(session, job_id))
    session.commit()
    assert lock_job(session, job_id).status == JobStatus.QUEUED
    grant(session, project, False)
    again, job = claim(session, job_id)
    assert again is None and job.status == JobStatus.FAILED
    assert (job.attempt, job.error_code) == (1, GRANT_REVOKED)
