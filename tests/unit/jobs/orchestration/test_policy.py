"""Orchestration policy: exit codes and trainer events to outcomes, and how outcomes settle."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from sqlalchemy.orm import Session

from jobs.orchestration.policy import (
    Outcome,
    Verdict,
    classify_exit,
    failed_attempts,
    settle_attempt,
    settle_expired_lease,
    stop_request,
)
from jobs.orchestration.states import transition
from jobs.recipe.exit_codes import ExitCode
from jobs.store.queries import lock_job
from jobs.store.status import JobStatus
from jobs.store.tables import Job, Project, utcnow

SUCCEEDED, FAILED, RETRY = Verdict.SUCCEEDED, Verdict.FAILED, Verdict.RETRY


def test_outcome_map_user_errors_fail_infra_errors_retry():
    assert classify_exit(0, None).verdict == SUCCEEDED
    nan = {"event": "failed", "code": "nan_loss", "exit_code": 4, "message": "loss nan at 7"}
    assert classify_exit(1, nan) == classify_exit(1, nan)
    assert classify_exit(1, nan).verdict == FAILED and classify_exit(1, nan).code == "nan_loss"
    crash = {"event": "failed", "code": "crash", "exit_code": 1, "message": "boom"}
    assert classify_exit(1, crash).verdict == RETRY
    assert classify_exit(1, {"event": "preempted", "step": 3}).verdict == RETRY
    assert classify_exit(ExitCode.PREEMPTED, None).code == "preempted"
    assert classify_exit(-9, None).verdict == RETRY and classify_exit(-9, None).code == "killed"
    assert classify_exit(ExitCode.INVALID_RECIPE, None).verdict == FAILED
    assert classify_exit(1, None).code == "crash"


def test_failed_event_json_shape_matches_the_contract():
    # the trainer's failed event carries code / exit_code / message (see jobs.recipe.exit_codes)
    record = json.loads(
        '{"event":"failed","step":3,"code":"data_error","exit_code":3,"message":"x"}'
    )
    assert classify_exit(1, record).verdict == FAILED


def running_job(session: Session, project: Project, status=JobStatus.RUNNING, **kw) -> Job:
    """A job on attempt 1 in `status`, moved there through the rules."""
    job = Job(project_id=project.id, name="j", status=JobStatus.QUEUED, **kw)
    session.add(job)
    session.commit()
    transition(session, job.id, JobStatus.STARTING, reason="claim", lease_owner="w1")
    transition(session, job.id, JobStatus.RUNNING, reason="started", attempt=1)
    if status != JobStatus.RUNNING:
        transition(session, job.id, status, reason="asked", attempt=1)
    session.commit()
    return lock_job(session, job.id)


def settle(session, job, outcome, stop_kind=None, attempt=1):
    result = settle_attempt(session, job, attempt, outcome, stop_kind, "w1")
    session.commit()
    return result, lock_job(session, job.id)


OK = Outcome(Verdict.SUCCEEDED, exit_code=0)
CRASH = Outcome(Verdict.RETRY, "crash", "boom", 1)
BAD_DATA = Outcome(Verdict.FAILED, "data_error", "bad row", 3)


def test_a_finished_attempt_succeeds(session, project):
    requeued, job = settle(session, running_job(session, project), OK)
    assert requeued is False and job.status == JobStatus.SUCCEEDED


def test_a_user_error_fails_at_once_with_its_code(session, project):
    requeued, job = settle(session, running_job(session, project), BAD_DATA)
    assert requeued is False and job.status == JobStatus.FAILED
    assert (job.error_code, job.error_message) == ("data_error", "bad row")


@pytest.mark.parametrize("outcome", [OK, CRASH, BAD_DATA], ids=["ok", "crash", "user"])
def test_cancel_wins_over_any_outcome(session, project, outcome):
    requeued, job = settle(session, running_job(session, project, JobStatus.CANCELLING), outcome)
    assert requeued is False and job.status == JobStatus.CANCELLED


def test_a_pause_that_finished_anyway_succeeded_else_paused(session, project):
    _, finished = settle(session, running_job(session, project, JobStatus.PAUSING), OK)
    assert finished.status == JobStatus.SUCCEEDED
    _, stopped = settle(session, running_job(session, project, JobStatus.PAUSING), CRASH)
    assert stopped.status == JobStatus.PAUSED


def test_an_infrastructure_failure_retries_until_the_budget_is_spent(session, project):
    job = running_job(session, project, max_attempts=2)
    requeued, job = settle(session, job, CRASH)
    assert requeued is True and job.status == JobStatus.QUEUED
    transition(session, job.id, JobStatus.STARTING, reason="claim 2", lease_owner="w1")
    transition(session, job.id, JobStatus.RUNNING, reason="started", attempt=2)
    session.commit()
    requeued, job = settle(session, lock_job(session, job.id), CRASH, attempt=2)
    assert requeued is False and job.status == JobStatus.FAILED and job.error_code == "crash"
    assert failed_attempts(session, job.id) == 2


def test_a_stale_or_finished_attempt_settles_nothing(session, project):
    job = running_job(session, project)
    assert settle(session, job, OK, attempt=7)[0] is None
    _, done = settle(session, job, OK)
    assert settle(session, done, CRASH)[0] is None
    assert lock_job(session, job.id).status == JobStatus.SUCCEEDED


@pytest.mark.parametrize(
    ("status", "expected"),
    [(JobStatus.CANCELLING, JobStatus.CANCELLED), (JobStatus.PAUSING, JobStatus.PAUSED),
     (JobStatus.RUNNING, JobStatus.QUEUED)],
)  # fmt: skip
def test_an_expired_lease_finishes_what_was_asked_or_retries(session, project, status, expected):
    job = running_job(session, project, status)
    job.lease_expires_at = utcnow() - timedelta(seconds=5)
    requeued = settle_expired_lease(session, job)
    session.commit()
    assert requeued is (expected == JobStatus.QUEUED)
    assert lock_job(session, job.id).status == expected


def test_stop_requests_come_from_cancelling_and_pausing_only():
    assert stop_request("cancelling") == "cancel" and stop_request("pausing") == "pause"
    assert [s for s in JobStatus if stop_request(s)] == [JobStatus.CANCELLING, JobStatus.PAUSING]
    assert stop_request("no-such-status") is None
