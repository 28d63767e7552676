"""Writing how an attempt ended, and re-queueing a job for its next attempt.

Shared by the supervisor (an attempt it ran ended) and the reconciler (an attempt's lease
expired). Every write goes through `jobs.orchestration.states.transition` with the attempt number, so a
worker that lost its job cannot settle it; an infrastructure failure becomes `retrying`,
then `queued` for a new attempt (which resumes from LATEST) while attempts remain, else
`failed`. The job id is sent to the broker only after the commit.
"""

from __future__ import annotations

import logging

from sqlalchemy.orm import Session

from jobs.orchestration.states import (
    JobStatus,
    TransitionRefused,
    failed_attempts,
    lock_job,
    transition,
)
from jobs.store.engine import session_scope
from jobs.store.leases import Claim, mark_dispatched
from jobs.store.tables import Job
from worker.outcome import FAILED, SUCCEEDED, Outcome

log = logging.getLogger("tuneyard.worker")


def settle_attempt(claim: Claim, worker: str, outcome: Outcome, stop_kind: str | None) -> bool:
    """Record the attempt's end; False when the job moved on without this worker."""
    requeued = False
    with session_scope() as session:
        job = lock_job(session, claim.job_id)
        if job.attempt != claim.attempt or job.status in ("succeeded", "failed", "cancelled"):
            return False
        data = {"worker": worker, "code": outcome.code, "exit_code": outcome.exit_code}
        try:
            requeued = _apply(session, job, outcome, stop_kind, data)
        except TransitionRefused as exc:
            log.warning("job %s: outcome %s refused: %s", claim.job_id, outcome.verdict, exc)
            return False
    if requeued:
        dispatch_after_commit(claim.job_id, claim.queue)
    return True


def _apply(session: Session, job: Job, outcome: Outcome, stop_kind: str | None, data: dict) -> bool:
    attempt, status = job.attempt, job.status
    if status == JobStatus.CANCELLING or stop_kind == "cancel":
        transition(session, job.id, "cancelled", attempt=attempt, reason="cancelled on request",
                   data=data)  # fmt: skip
        return False
    if status == JobStatus.PAUSING:
        done = outcome.verdict == SUCCEEDED
        transition(session, job.id, "succeeded" if done else "paused", attempt=attempt, data=data,
                   reason="finished before it could pause" if done else "paused on request; "
                   "resume continues from the LATEST checkpoint")  # fmt: skip
        return False
    if outcome.verdict == SUCCEEDED:
        transition(session, job.id, "succeeded", attempt=attempt, reason="trainer finished",
                   data=data)  # fmt: skip
        return False
    if outcome.verdict == FAILED:
        transition(session, job.id, "failed", attempt=attempt, data=data,
                   reason=f"user error {outcome.code}: {outcome.message}",
                   error_code=outcome.code, error_message=outcome.message)  # fmt: skip
        return False
    return retry_or_fail(session, job, outcome.code or "crash", outcome.message, data)


def retry_or_fail(session: Session, job: Job, code: str, message: str, data: dict) -> bool:
    """Infrastructure failure of the current attempt: queue the next one, or fail if spent.

    Returns True when the job went back to `queued` (the caller dispatches it after commit).
    """
    attempt = job.attempt
    transition(session, job.id, "retrying", attempt=attempt, data=data,
               reason=f"attempt {attempt} failed ({code}): {message}")  # fmt: skip
    failures = failed_attempts(session, job.id)  # a pause or resume spends no retry
    if failures >= job.max_attempts:
        transition(session, job.id, "failed", attempt=attempt, data=data,
                   reason=f"{code}: {failures} failed attempts of {job.max_attempts} allowed",
                   error_code=code, error_message=message)  # fmt: skip
        return False
    transition(session, job.id, "queued", attempt=attempt, data=data,
               reason=f"attempt {attempt + 1} resumes from LATEST "
                      f"({failures} of {job.max_attempts} allowed failures used)")  # fmt: skip
    return True


def dispatch_after_commit(job_id: str, queue: str) -> bool:
    """Send the job id to the broker and note it; False leaves it to the reconciler."""
    from jobs.broker import enqueue_job

    try:
        enqueue_job(job_id, queue)
    except Exception as exc:  # broker down: the reconciler re-dispatches queued jobs
        log.warning(
            "job %s: enqueue to %s failed (%s); the reconciler will retry", job_id, queue, exc
        )
        return False
    try:
        with session_scope() as session:
            mark_dispatched(session, job_id)
    except Exception as exc:  # harmless: at worst the reconciler sends it once more
        log.warning("job %s: could not record dispatch (%s)", job_id, exc)
    return True
