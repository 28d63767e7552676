"""Orchestration policy: exit codes, trainer events and the ranks' failure records to
outcomes (the first cause and the ranks that saw it), and how outcomes settle."""

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
    failed_attempts_by_job,
    first_cause,
    settle_attempt,
    settle_expired_lease,
    stop_request,
)
from jobs.orchestration.states import transition
from jobs.recipe.exit_codes import ExitCode, RankFailure
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


def _claim_and_run(session, job_id, attempt):
    transition(session, job_id, JobStatus.STARTING, reason="claim", lease_owner="w1")
    transition(session, job_id, JobStatus.RUNNING, reason="started", attempt=attempt)
    session.commit()


def test_pauses_and_resumes_spend_no_retry_budget(session, project):
    """Three user pauses make attempt 4, yet a crash then still retries: the budget of 2
    counts failures only, and each job's failures are counted in one query."""
    job = running_job(session, project, max_attempts=2)
    for attempt in (1, 2, 3):
        transition(session, job.id, JobStatus.PAUSING, reason="pause", attempt=attempt)
        settle(session, lock_job(session, job.id), CRASH, stop_kind="pause", attempt=attempt)
        transition(session, job.id, JobStatus.QUEUED, reason="resume")
        _claim_and_run(session, job.id, attempt + 1)
    assert failed_attempts(session, job.id) == 0
    requeued, job = settle(session, lock_job(session, job.id), CRASH, attempt=4)
    assert requeued is True and job.attempt == 4 and job.status == JobStatus.QUEUED
    other = running_job(session, project)
    assert failed_attempts_by_job(session, [job.id, other.id]) == {job.id: 1}
    assert failed_attempts_by_job(session, []) == {}


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


def failure(rank: int, code: ExitCode, message: str, at: float, world: int = 2, fix: str = ""):
    return RankFailure(rank, int(code), message, fix, 2, at, world, 1)


DATA = "shard-3.jsonl:17: not valid JSON"
PEER_LOST = "DistBackendError: [../gloo/transport/tcp/pair.cc:534] Connection closed by peer"


def test_the_first_cause_is_the_user_error_whichever_rank_saw_it():
    records = [
        failure(0, ExitCode.CRASH, PEER_LOST, 1.0),
        failure(1, ExitCode.DATA_ERROR, DATA, 2.0, fix="drop line 17"),
    ]
    cause = first_cause(records)
    assert (cause.code, cause.exit_code, cause.ranks, cause.step) == ("data_error", 3, (1,), 2)
    assert cause.describe() == f"[rank 1] {DATA} (fix: drop line 17)"
    rank0_event = {"event": "failed", "code": "crash", "exit_code": 1, "message": PEER_LOST}
    outcome = classify_exit(1, rank0_event, cause)
    assert outcome == Outcome(FAILED, "data_error", cause.describe(), 3)
    assert first_cause([]) is None and classify_exit(0, None, cause).verdict == SUCCEEDED


def test_a_crash_of_a_rank_own_comes_before_one_a_lost_peer_caused_then_the_earliest():
    lost = failure(0, ExitCode.CRASH, PEER_LOST, 1.0)
    bug = failure(1, ExitCode.CRASH, "ValueError: bug", 5.0)
    assert first_cause([lost, bug]).message == "ValueError: bug"
    assert classify_exit(1, None, first_cause([lost, bug])).verdict == RETRY
    late = failure(0, ExitCode.CRASH, "KeyError: 'x'", 9.0)
    assert first_cause([late, bug]).ranks == (1,)
    first_oom = [
        failure(1, ExitCode.OUT_OF_MEMORY, "out of memory", 3.0),
        failure(0, ExitCode.DATA_ERROR, DATA, 4.0),
    ]
    assert first_cause(first_oom).code == "out_of_memory"


def test_every_rank_that_saw_the_cause_is_named():
    same = [failure(r, ExitCode.DATA_ERROR, DATA, 1.0 + r, world=8) for r in (0, 1, 2, 3, 6)]
    assert first_cause(same).ranks == (0, 1, 2, 3, 6)
    assert first_cause(same).describe().startswith("[ranks 0-3, 6] ")
    assert first_cause(same[:2]).describe() == f"[ranks 0, 1] {DATA}"
    alone = first_cause([failure(0, ExitCode.DATA_ERROR, DATA, 1.0, world=1)])
    assert alone.describe() == DATA  # a one-rank run reads as it always did


def test_rank0_event_stands_in_for_a_missing_rank0_record():
    event = {
        "event": "failed",
        "step": 1,
        "code": "data_error",
        "exit_code": 3,
        "message": DATA,
        "timestamp": 1.0,
    }
    cause = first_cause([failure(1, ExitCode.CRASH, PEER_LOST, 2.0)], event)
    assert (cause.code, cause.ranks, cause.message) == ("data_error", (0,), DATA)
    assert cause.reported_in(event)
    other = first_cause([failure(1, ExitCode.DATA_ERROR, DATA, 0.5)], event)
    assert other.ranks == (0, 1) and other.reported_in(event)
    long = "ValueError: " + "x" * 5000  # records are clipped; rank 0's event is not
    read = RankFailure.from_json(failure(0, ExitCode.CRASH, long, 1.0).to_json())
    long_event = {"event": "failed", "code": "crash", "exit_code": 1, "message": long}
    assert first_cause([read]).reported_in(long_event)
    crashed = {**event, "code": "crash", "exit_code": 1, "message": PEER_LOST, "timestamp": 3.0}
    rank1_cause = first_cause([failure(1, ExitCode.DATA_ERROR, DATA, 2.0)], crashed)
    assert rank1_cause.ranks == (1,) and not rank1_cause.reported_in(crashed)


def test_the_worker_event_for_a_cause_reads_back_as_the_same_outcome():
    cause = first_cause([failure(1, ExitCode.DATA_ERROR, DATA, 2.0)])
    event = json.loads(json.dumps(cause.as_event(5.0)))
    assert (event["event"], event["ranks"], event["message"]) == ("failed", [1], cause.describe())
    assert classify_exit(1, event) == classify_exit(1, None, cause)


def test_a_rank_one_cause_settles_as_the_job_error(session, project):
    cause = first_cause([failure(1, ExitCode.DATA_ERROR, DATA, 2.0, fix="drop line 17")])
    _, job = settle(session, running_job(session, project), classify_exit(1, None, cause))
    assert (job.status, job.error_code) == (JobStatus.FAILED, "data_error")
    assert job.error_message == f"[rank 1] {DATA} (fix: drop line 17)"
